"""kv_hold_wait: a prefill engine whose only requests are finished ones holding KV for a
read waits on its input queue between steps; in every other state it steps as vLLM does.
On a stand-in engine (the wait itself), and installed on vLLM's own EngineCoreProc."""

import queue
import types

import pytest

from pdspec.worker.engine import features
from pdspec.worker.engine.wrap_once import is_wrapped
from prefill_worker.engine import kv_hold_wait
from prefill_worker.engine.kv_hold_wait import MARKER, _waiting_step, only_held_kv


class Scheduler:
    def __init__(self, unfinished=False, held=True, just_finished=()):
        self.unfinished, self.held, self.finished_req_ids = unfinished, held, set(just_finished)

    def has_unfinished_requests(self):
        return self.unfinished

    def has_finished_requests(self):
        return self.held or bool(self.finished_req_ids)


class Inputs:
    """The engine's input queue: records each wait; hands out what it was given."""

    def __init__(self, *requests):
        self.requests, self.waits = list(requests), []

    def get(self, timeout=None):
        self.waits.append(timeout)
        if not self.requests:
            raise queue.Empty
        return self.requests.pop(0)


class Engine:
    def __init__(self, scheduler, inputs, executed=False, dp=1, batch_queue=None):
        self.scheduler, self.input_queue, self.executed, self.batch_queue = scheduler, inputs, executed, batch_queue
        self.vllm_config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(data_parallel_size=dp))
        self.handled, self.steps = [], 0

    def _process_engine_step(self):
        self.steps += 1
        return self.executed

    def _handle_client_request(self, kind, request):
        self.handled.append((kind, request))


def batch(scheduled_tokens):
    """One entry of vLLM's asynchronous-scheduling batch queue: (future, scheduler output, ...)."""
    return (None, types.SimpleNamespace(total_num_scheduled_tokens=scheduled_tokens), None)


def step(engine, poll_s=0.5):
    return _waiting_step(type(engine)._process_engine_step, poll_s)(engine)


def test_only_held_kv_is_a_scheduler_with_nothing_but_delayed_frees():
    assert only_held_kv(Scheduler())
    assert not only_held_kv(Scheduler(unfinished=True))  # a waiting or running request
    assert not only_held_kv(Scheduler(held=False))  # idle: vLLM blocks on its own
    assert not only_held_kv(Scheduler(just_finished={"r"}))  # the worker is yet to hear of it
    assert not only_held_kv(object())  # another scheduler: no wait


def test_an_engine_holding_only_kv_waits_for_a_request_and_takes_it():
    engine = Engine(Scheduler(), Inputs(("ADD", "req-1")))
    assert step(engine) is False
    assert engine.input_queue.waits == [0.5] and engine.handled == [("ADD", "req-1")]
    engine = Engine(Scheduler(), Inputs())  # nothing came: the next step polls the reads
    step(engine, poll_s=0.25)
    assert engine.input_queue.waits == [0.25] and engine.handled == []


def test_an_empty_batch_in_flight_still_waits():
    """Asynchronous scheduling (vLLM's default on GPUs) keeps one batch queued even when it
    schedules nothing; on vLLM 0.33 the wait never happened until this counted as idle."""
    engine = Engine(Scheduler(), Inputs(("ADD", "req-1")), batch_queue=[batch(0)])
    step(engine)
    assert engine.input_queue.waits == [0.5] and engine.handled == [("ADD", "req-1")]


@pytest.mark.parametrize(
    "engine",
    [
        Engine(Scheduler(unfinished=True), Inputs()),  # a request waits or runs
        Engine(Scheduler(), Inputs(), executed=True),  # the step computed tokens
        Engine(Scheduler(), Inputs(), dp=2),  # data-parallel ranks step together
        Engine(Scheduler(), Inputs(), batch_queue=[batch(0), batch(12)]),  # a batch computing tokens in flight
        Engine(Scheduler(), Inputs(), batch_queue=[object()]),  # a queue vLLM's doesn't look like
    ],
)
def test_every_other_state_steps_as_vllm_does(engine):
    step(engine)
    assert engine.input_queue.waits == [] and engine.steps == 1


def test_installed_on_vllms_engine_core_and_reported(monkeypatch):
    core = pytest.importorskip("vllm.v1.engine.core")
    monkeypatch.setattr(core.EngineCoreProc, "_process_engine_step", core.EngineCoreProc._process_engine_step)
    monkeypatch.setenv(kv_hold_wait.POLL_ENV, "0")
    kv_hold_wait.install_kv_hold_wait()
    assert features.reported()[features.KV_HOLD_WAIT][0] == "off"
    assert not is_wrapped(core.EngineCoreProc._process_engine_step, MARKER)
    monkeypatch.setenv(kv_hold_wait.POLL_ENV, "0.5")
    kv_hold_wait.install_kv_hold_wait()
    kv_hold_wait.install_kv_hold_wait()  # idempotent
    assert is_wrapped(core.EngineCoreProc._process_engine_step, MARKER)
    assert core.EngineCoreProc._process_engine_step.__wrapped__.__qualname__ == "EngineCoreProc._process_engine_step"
    assert features.reported()[features.KV_HOLD_WAIT] == ("on", "")
    # vLLM's scheduler has the calls the check makes.
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler

    assert all(hasattr(VllmScheduler, name) for name in ("has_unfinished_requests", "has_finished_requests"))
