"""The engine plugin's counters (prefix `pdspec_`), created in vLLM's engine-core process.
With PROMETHEUS_MULTIPROC_DIR set (pdspec's launcher sets it) they appear on the API
server's /metrics beside vLLM's own. The engine features' gauge and the KV-only pass's
counter live in features.py."""

from __future__ import annotations

import gc
import os
import threading
import time

from prometheus_client import Counter

PROPOSALS = Counter("pdspec_proposals", "Engine steps in which the speculative drafter ran.")
K0_PROPOSALS = Counter("pdspec_k0_proposals", "Drafter steps that proposed with K=0 (drafts unusable).")
# K>0 steps taken while the policy was `auto`: what the "prefill worker drafting under
# auto" alert reads. Counted here, at the step, because a rate of proposals minus K=0
# proposals joined with the *current* policy also counts steps made under `always`
# before a switch back to `auto` (a false alarm after every A/B benchmark).
K_POSITIVE_AUTO_PROPOSALS = Counter(
    "pdspec_k_positive_auto_proposals", "Drafter steps that proposed with K>0 while the drafts policy was auto."
)
DRAFT_TOKENS_SKIPPED = Counter(
    "pdspec_draft_tokens_skipped", "Draft tokens not proposed because no request could use them."
)
# The counters above are the scheduler's decision. On vLLM 0.33's V2 runner with data
# parallelism the ranks then AND their "skip drafts" votes, so what a rank really ran can
# differ: these count the runner's own steps (dummy batches of idle ranks left out).
RUNNER_PROPOSALS = Counter(
    "pdspec_runner_proposals", "V2 runner steps with a drafter, as run after the data-parallel ranks agreed on K."
)
RUNNER_K0_PROPOSALS = Counter(
    "pdspec_runner_k0_proposals", "V2 runner steps whose drafter ran with K=0, after the data-parallel agreement."
)
STALE_KV_RECOMPUTED = Counter(
    "pdspec_stale_kv_recomputed",
    "Decode requests prefilled here because their prefill worker's KV lease may have run out before the "
    "scheduler got them (stale_kv.py).",
)

# Time the engine process spends in Python's garbage collector, by generation. A pause
# stops the scheduler and the model runner alike; a count that grows from rep to rep of a
# benchmark (objects piling up) shows here first (loadtest.prefill_bench prints it a rep).
GC_PAUSE_SECONDS = Counter(
    "pdspec_engine_gc_pause_seconds",
    "Seconds this engine process spent in Python's garbage collector.",
    ["generation"],
)
GC_FLUSH_INTERVAL_S = 1.0
GC_GENERATIONS = 3
_gc_started: list[float] = []
# Seconds of GC so far, per generation, and how much of it the counter has. The GC
# callback only adds to a float here. It must never touch prometheus-client: a collection
# can start while this thread holds the client's (non-reentrant) value lock, inside any
# metric's inc(), and an inc() from the callback then waits for that lock forever (an
# engine hung at start-up on the H200 that way). A thread of its own moves the difference
# into the counter each second.
_gc_seconds = [0.0] * GC_GENERATIONS
_gc_flushed = [0.0] * GC_GENERATIONS
_flush_lock = threading.Lock()
_clock = time.perf_counter  # bound now: the callback also runs while the interpreter shuts down
_flusher: threading.Thread | None = None


def install_gc_pause_counter() -> None:
    """Counts this process's GC pauses into GC_PAUSE_SECONDS, and those of every process
    forked from it (vLLM forks its engine core after loading plugins: the child keeps the
    callback but not the thread, so the thread starts again there)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
        # A fork waits for a flush in progress: the child must not start with the flusher
        # inside prometheus-client, holding its value lock (every later inc() there would
        # wait for it forever).
        os.register_at_fork(
            before=_hold_flush_lock, after_in_parent=_release_flush_lock, after_in_child=_after_fork_in_child
        )
    _start_flusher()


def _hold_flush_lock() -> None:
    _flush_lock.acquire()


def _release_flush_lock() -> None:
    _flush_lock.release()


def _start_flusher() -> None:
    global _flusher
    if _flusher is None or not _flusher.is_alive():
        _flusher = threading.Thread(target=_flush_forever, name="pdspec-gc-pauses", daemon=True)
        _flusher.start()


def _after_fork_in_child() -> None:
    global _flusher, _flush_lock
    _gc_seconds[:] = [0.0] * GC_GENERATIONS  # the parent's pauses are the parent's
    _gc_flushed[:] = [0.0] * GC_GENERATIONS
    _flush_lock = threading.Lock()  # a lock held by a parent thread at the fork stays held here
    _flusher = None
    _start_flusher()


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_started[:] = [_clock()]
    elif _gc_started:
        generation = info.get("generation", 0)
        if 0 <= generation < GC_GENERATIONS:
            _gc_seconds[generation] += _clock() - _gc_started.pop()


def flush_gc_pauses() -> None:
    """Moves the pauses measured since the last flush into GC_PAUSE_SECONDS."""
    with _flush_lock:
        for generation in range(GC_GENERATIONS):
            total = _gc_seconds[generation]
            if total > _gc_flushed[generation]:
                GC_PAUSE_SECONDS.labels(str(generation)).inc(total - _gc_flushed[generation])
                _gc_flushed[generation] = total


def _flush_forever() -> None:
    while True:
        time.sleep(GC_FLUSH_INTERVAL_S)
        try:
            flush_gc_pauses()
        except Exception:  # noqa: BLE001 (metrics folder gone at shutdown: stop counting)
            return
