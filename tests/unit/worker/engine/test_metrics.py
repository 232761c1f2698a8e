"""The engine process's GC pause counter (metrics.py)."""

import gc

from pdspec.worker.engine import metrics


def gc_seconds() -> float:
    return sum(s.value for s in metrics.GC_PAUSE_SECONDS.collect()[0].samples if s.name.endswith("_total"))


def test_gc_pauses_reach_the_counter_once_flushed():
    metrics.install_gc_pause_counter()
    metrics.install_gc_pause_counter()
    assert gc.callbacks.count(metrics._on_gc) == 1
    assert metrics._flusher is not None and metrics._flusher.is_alive()
    metrics.flush_gc_pauses()
    before = gc_seconds()
    garbage = [[i] for i in range(200_000)]
    del garbage
    gc.collect()
    metrics.flush_gc_pauses()
    assert gc_seconds() > before


def test_the_gc_callback_never_touches_prometheus_client(monkeypatch):
    """A collection can start inside a metric's inc(), with prometheus-client's value lock
    held: the callback must not take it again (it would wait forever)."""

    def locked(*args):
        raise AssertionError("the GC callback called into prometheus-client")

    monkeypatch.setattr(metrics.GC_PAUSE_SECONDS, "labels", locked)
    gc.disable()  # no real collection while the stand-in is in place
    try:
        queued = len(metrics._gc_pauses)
        metrics._on_gc("start", {"generation": 2})
        metrics._on_gc("stop", {"generation": 2})
        assert len(metrics._gc_pauses) == queued + 1 and metrics._gc_pauses[-1][0] == 2
    finally:
        metrics._gc_pauses.clear()
        gc.enable()
