"""The engine process's GC pause counter (metrics.py)."""

import gc

from pdspec.worker.engine import metrics


def gc_seconds() -> float:
    return sum(s.value for s in metrics.GC_PAUSE_SECONDS.collect()[0].samples if s.name.endswith("_total"))


def test_gc_pauses_are_counted_once_per_process():
    metrics.install_gc_pause_counter()
    metrics.install_gc_pause_counter()
    assert gc.callbacks.count(metrics._on_gc) == 1
    before = gc_seconds()
    garbage = [[i] for i in range(200_000)]
    del garbage
    gc.collect()
    assert gc_seconds() > before


def test_a_pause_that_cannot_be_counted_is_dropped_not_raised(monkeypatch):
    gc.disable()  # no real collection between the two calls below
    monkeypatch.setattr(metrics, "_gc_started", [])
    metrics._on_gc("start", {"generation": 2})

    def broken(*args):
        raise FileNotFoundError("metrics folder gone")

    monkeypatch.setattr(metrics.GC_PAUSE_SECONDS, "labels", broken)
    try:
        metrics._on_gc("stop", {"generation": 2})
        assert metrics._gc_started == []
    finally:
        gc.enable()
