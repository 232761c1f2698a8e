"""The decode worker's scheduler (decode_worker/engine/scheduler.py): the shared K=0
scheduler with the stale-KV guard in front, so a stale request loses its remote KV before
either the K=0 rule or vLLM's scheduler sees it; the prefill worker's has no guard."""

from __future__ import annotations

import pytest

from decode_worker.engine.scheduler import DecodeScheduler
from decode_worker.engine.stale_kv import StaleKvMixin
from pdspec.worker.engine import k0_scheduler
from pdspec.worker.engine.k0_scheduler import K0Scheduler
from pdspec.worker.roles import ROLES


def test_the_decode_role_runs_it_and_the_prefill_role_the_plain_k0_scheduler():
    assert ROLES["decode"].scheduler_cls == f"{DecodeScheduler.__module__}.{DecodeScheduler.__name__}"
    assert ROLES["prefill"].scheduler_cls == f"{K0Scheduler.__module__}.{K0Scheduler.__name__}"
    assert issubclass(DecodeScheduler, K0Scheduler)
    assert DecodeScheduler.FRONT == (StaleKvMixin,) and K0Scheduler.FRONT == ()


def test_the_guard_comes_before_the_k0_rule_and_vllms_scheduler():
    pytest.importorskip("vllm")
    from vllm.v1.core.sched.scheduler import Scheduler

    (sync_cls, async_cls) = k0_scheduler._scheduler_classes(DecodeScheduler.FRONT)
    for cls in (sync_cls, async_cls):
        mro = cls.__mro__
        assert mro.index(StaleKvMixin) < mro.index(k0_scheduler._K0Mixin) < mro.index(Scheduler)
