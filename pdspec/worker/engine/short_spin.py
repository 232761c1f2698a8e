"""CPU builds: vLLM's shared-memory queue readers spin for `window_ms` after their last
message before they sleep, not for a second (the `short_spin` engine feature).

vLLM's engine core and its worker process talk through a shared-memory ring
(`shm_broadcast.MessageQueue`). A reader that finds no message calls `sched_yield()` and
looks again for `SpinCondition.busy_loop_s` (1 s) after its last read, and only then
sleeps on a ZMQ notification, which every write sends. On a GPU host that costs a core
that is there to spare. Here every worker shares two cores with three others: the engine
core spins through each model step while it waits for the worker's output (a 150 ms
prefill: 150 ms of a core), the worker spins for a second after every step burst, and a
`sched_yield` spinner still takes its share of a core from the engine beside it. With a
window of a few milliseconds a reader still catches the next message of a busy loop (the
engine core sends the next step within about a millisecond) and sleeps otherwise, woken
by the notification (tens of microseconds).

A reader that sleeps must not miss its wake-up for long. vLLM's reader sleeps in a poll
of the notification socket for up to `SHM_READER_RECHECK_INTERVAL_MS` (5 s), then looks
at the ring again; with a window of milliseconds a reader sleeps between most messages,
and now and then a notification does not wake it (how it is lost inside vLLM's ZMQ
notification, whose writer socket drops at a high-water mark of 1, was not traced): on
the CPU 1P1D at 2 requests/s every decode stream and every new request then stopped for
5.02 s at once, the recheck interval, in 3 of 12 runs (`loadtest/serving/stall_probe.py`,
`loadtest/results/stalls-cpu/`; the multi-second stalls of `serve_bench` phases here), and
in none of 24 with the bound. So a short-spinning
reader's sleep is cut into polls of at most `RECHECK_MS` (20 ms): a lost notification
costs that much, and an idle reader wakes 50 times a second to look (a poll and a read of
one flag): measured with `loadtest.kv_hold_cpu`, a 1P1D pair idle takes 0.05 core per
worker, and holding a prompt's KV 0.07 for the prefill worker (0.05 before the bound).

With `in_core_worker` (CPU builds' default) a one-process engine has no worker process and
no such queue: then this is off, with that reason; it acts on engines of several ranks and
with `in_core_worker` off.

Failure policy: off (reported) on GPU builds, with `window_ms` 0, or where vLLM's
SpinCondition has no `busy_loop_s`; it changes a timing only, never what is read.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import MODEL_IN_CORE_ENV
from pdspec.worker.engine.control import SPIN_WINDOW_ENV as WINDOW_ENV
from pdspec.worker.engine.in_core_worker import NO_QUEUE
from pdspec.worker.engine.wrap_once import wrap_once

MARKER = "short_spin"
RECHECK_MS = 20  # longest sleep of a short-spinning reader between looks at its ring


def _short_window(original: Any, window_s: float) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if getattr(self, "is_reader", False):
            self.busy_loop_s = min(self.busy_loop_s, window_s)

    return __init__


def _bounded_sleep(original: Any, recheck_ms: int) -> Any:
    @functools.wraps(original)
    def wait(self: Any, timeout_ms: int | None = None) -> None:
        original(self, recheck_ms if timeout_ms is None else min(timeout_ms, recheck_ms))

    return wait


def install_short_spin() -> None:
    """Called by pdspec's vLLM plugin in every process of a P/D worker (the engine core
    and the worker process both read a queue). Off in an engine core that runs its model
    itself (in_core_worker.py; its API server reports the same once it switched): there is
    no queue to read."""
    window_ms = float(os.environ.get(WINDOW_ENV, "0") or 0)
    if os.environ.get(MODEL_IN_CORE_ENV) == "1":  # started by in_core_worker.py's bound start
        features.report(features.SHORT_SPIN, False, NO_QUEUE)
        return
    if window_ms <= 0:
        features.report(features.SHORT_SPIN, False, f"off by setting ({WINDOW_ENV}=0)")
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            features.report(features.SHORT_SPIN, False, "not a CPU build (vLLM's one-second spin kept)")
            return
        from vllm.distributed.device_communicators import shm_broadcast
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:
        features.report(features.SHORT_SPIN, False, "vLLM has no shm_broadcast.SpinCondition here")
        return
    if getattr(shm_broadcast, "SPINLOOP_EXT_ENABLED", False):
        # Its reads spin 100 ms in the extension before each wait: bounded waits would
        # make an idle reader spin most of the time, the opposite of this feature.
        features.report(features.SHORT_SPIN, False, "vLLM's spin-loop extension is on (VLLM_USE_SPINLOOP_EXT)")
        return
    wrap_once(SpinCondition, "__init__", MARKER, lambda original: _short_window(original, window_ms / 1000))
    wrap_once(SpinCondition, "wait", MARKER, lambda original: _bounded_sleep(original, RECHECK_MS))
    features.report(features.SHORT_SPIN, True)
