"""A prefill worker whose only requests wait for their KV to be read waits for new work
instead of stepping (the `kv_hold_wait` engine feature).

After a prefill, vLLM keeps the request (its blocks held, "delayed free") until the decode
worker has read its KV. Meanwhile `Scheduler.has_requests()` is true, so the engine core
never blocks on its input queue: it steps with nothing scheduled, sleeps 1 ms, and steps
again (`EngineCore._process_engine_step`), each empty step a call of the model runner (a
round trip to vLLM's worker process where it has one, whose shared-memory reader then spins
between them; with `in_core_worker` the model runs in the engine core). Measured on the CPU build
(one 960-token prompt held, nothing else to do): the prefill worker's processes took 1.4
cores of this 2-core machine, against 0.05 idle; two prefill workers on one core, each
slowing the other's prefills, made the routing benchmark's prefill tail 15 times its
median. Here, when a step computed nothing and no request waits or runs (only finished
ones whose KV is held for a read), the engine core waits on its input queue for up to
`poll_s` before its next step: a new request ends the wait at once and is scheduled in
the next step, which also learns of every read finished meanwhile. Nothing waits for the
held blocks in between (a request that needs them is a waiting request, and then the
engine steps as vLLM does), so the blocks are freed at most `poll_s` later, unseen.

What sees the lag: only observers of the held blocks, such as the proxy's KV-room
admission (`admission.prefill_kv`), which learns of the freed room up to `poll_s` later.
vLLM's stall watchdog (0.33, off unless its dump directory is set) only dumps stacks, after
a timeout far above the 5 s this wait is bounded by (`kv_hold_poll_s`).

Failure policy: off (reported) where vLLM's engine core lacks the hooks; never waits
when its data-parallel group has more than one rank (the ranks step together) or while
a batch that computes tokens is in flight (asynchronous scheduling); a scheduler or a
batch queue without the expected attributes raises nothing: the wait is skipped and
vLLM's loop goes on as before.
"""

from __future__ import annotations

import functools
import os
import queue
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import KV_HOLD_POLL_ENV as POLL_ENV
from pdspec.worker.engine.wrap_once import wrap_once

MARKER = "kv_hold_wait"


def only_held_kv(scheduler: Any) -> bool:
    """True when the scheduler's only requests are finished ones whose blocks are held for
    a KV read: nothing waits or runs, and no finished request is left to tell the worker."""
    try:
        return (
            not scheduler.has_unfinished_requests()
            and not scheduler.finished_req_ids
            and scheduler.has_finished_requests()
        )
    except AttributeError:
        return False


def _waiting_step(original: Any, poll_s: float) -> Any:
    @functools.wraps(original)
    def _process_engine_step(self: Any) -> bool:
        executed = original(self)
        if executed or _batch_in_flight(self) or _data_parallel(self) or not only_held_kv(self.scheduler):
            return executed
        try:
            request = self.input_queue.get(timeout=poll_s)
        except queue.Empty:
            return executed
        self._handle_client_request(*request)
        return executed

    return _process_engine_step


def _batch_in_flight(engine: Any) -> bool:
    """Asynchronous scheduling (vLLM's default on GPUs) keeps up to two batches queued, and
    with only held KV one empty batch stays in flight (its output carries the finished
    reads): waiting then delays nothing either. A queued batch that computes tokens is
    work in flight: no wait."""
    batches = getattr(engine, "batch_queue", None)
    if not batches:
        return False
    try:
        return any(batch[1].total_num_scheduled_tokens > 0 for batch in batches)
    except (AttributeError, IndexError, TypeError):
        return True


def _data_parallel(engine: Any) -> bool:
    """Data-parallel ranks step together: a rank that waited would stall the others."""
    try:
        return engine.vllm_config.parallel_config.data_parallel_size > 1
    except AttributeError:
        return True


def install_kv_hold_wait() -> None:
    """Called by pdspec's vLLM plugin in every process of a prefill worker; wraps the engine
    core's step (a class attribute: any process may wrap it, only the engine core calls
    it). Data-parallel engines keep vLLM's own loop (`_data_parallel`)."""
    poll_s = float(os.environ.get(POLL_ENV, "0") or 0)
    if poll_s <= 0:
        features.report(features.KV_HOLD_WAIT, False, f"off by setting ({POLL_ENV}=0)")
        return
    try:
        from vllm.v1.engine.core import EngineCoreProc
    except ImportError:
        features.report(features.KV_HOLD_WAIT, False, "vLLM has no v1 EngineCoreProc here")
        return
    if not all(hasattr(EngineCoreProc, name) for name in ("_process_engine_step", "_handle_client_request")):
        features.report(features.KV_HOLD_WAIT, False, "vLLM's EngineCoreProc has no _process_engine_step")
        return
    wrap_once(EngineCoreProc, "_process_engine_step", MARKER, lambda original: _waiting_step(original, poll_s))
    features.report(features.KV_HOLD_WAIT, True)
