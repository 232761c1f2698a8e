"""The engine process's GC pause counter (metrics.py)."""

import gc
import multiprocessing
import os
import threading
import time

import pytest

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
    held: the callback must not take it again (it would wait forever). The flush lock is
    held meanwhile, so the flush thread cannot call the stand-in either."""

    def locked(*args):
        raise AssertionError("the GC callback called into prometheus-client")

    with metrics._flush_lock:
        monkeypatch.setattr(metrics.GC_PAUSE_SECONDS, "labels", locked)
        before = metrics._gc_seconds[2]
        metrics._on_gc("start", {"generation": 2})
        metrics._on_gc("stop", {"generation": 2})
        assert metrics._gc_seconds[2] > before
        monkeypatch.undo()


def _child_flusher_alive(queue):
    queue.put(metrics._flusher is not None and metrics._flusher.is_alive() and metrics._gc_flushed == [0.0] * 3)


def test_a_forked_child_counts_its_own_pauses_from_zero():
    """vLLM forks its engine core after loading the plugin: the child gets a flush thread
    of its own and starts from zero, not from the parent's totals."""
    metrics.install_gc_pause_counter()
    metrics.flush_gc_pauses()
    queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_child_flusher_alive, args=(queue,))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and queue.get(timeout=5) is True
    assert os.getpid() != child.pid


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_fork_waits_for_a_flush_in_progress():
    """The flusher inside prometheus-client at a fork would leave the child with its value
    lock held (vLLM forks its engine core from the API server, where it runs, wherever it
    does not spawn)."""
    metrics.install_gc_pause_counter()
    held, released_at = threading.Event(), []

    def flushing():
        with metrics._flush_lock:  # as flush_gc_pauses holds it
            held.set()
            time.sleep(0.3)
            released_at.append(time.monotonic())

    thread = threading.Thread(target=flushing)
    thread.start()
    held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: its lock is free
        os._exit(0 if metrics._flush_lock.acquire(timeout=5) else 1)
    forked_at = time.monotonic()
    thread.join()
    assert os.waitpid(pid, 0)[1] == 0
    assert released_at and forked_at >= released_at[0]  # the fork waited for the flush
