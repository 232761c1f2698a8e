"""The K=0 scheduler (pdspec/worker/engine/k0_scheduler.py): the state the rule reports, and
the classes it builds in front of vLLM's scheduler (a role's mixins first)."""

from __future__ import annotations

import pytest

from pdspec.worker.engine import k0_scheduler
from pdspec.worker.engine.k0_scheduler import _k0_rule_state


@pytest.mark.parametrize(
    "active, native, dp, on, fragment",
    [
        (True, False, 1, True, ""),
        (True, True, 2, True, ""),
        (False, False, 1, False, "no forward"),
        (True, False, 2, False, "data parallelism"),
    ],
)
def test_the_k0_rule_reports_why_it_is_off(active, native, dp, on, fragment):
    state, reason = _k0_rule_state(active, native, dp, type("Spec", (), {"method": "ngram"})())
    assert state is on and fragment in reason


class Front:
    """A role's mixin, as the decode worker's stale-KV guard is one."""


def test_a_roles_mixins_sit_in_front_of_the_k0_rule_and_vllms_scheduler():
    pytest.importorskip("vllm")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    plain_sync, plain_async = k0_scheduler._scheduler_classes()
    sync_cls, async_cls = k0_scheduler._scheduler_classes((Front,))
    assert Front not in plain_sync.__mro__ and Front not in plain_async.__mro__
    for cls, vllms in ((sync_cls, Scheduler), (async_cls, AsyncScheduler)):
        mro = cls.__mro__
        assert mro.index(Front) < mro.index(k0_scheduler._K0Mixin) < mro.index(vllms)
