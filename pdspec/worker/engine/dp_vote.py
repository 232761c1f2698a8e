"""Data parallelism on vLLM 0.33's V2 runner: an idle rank's vote on a prefill worker, and
the runner's own count of the K each real step ran with (`pdspec_runner_*`)."""

from __future__ import annotations

import functools
import logging
import os
from contextvars import ContextVar
from typing import Any

from pdspec.worker.draft_rule import dp_vote
from pdspec.worker.engine import features
from pdspec.worker.engine.control import DP_IDLE_RANK_VOTE_ENV
from pdspec.worker.engine.metrics import RUNNER_K0_PROPOSALS, RUNNER_PROPOSALS
from pdspec.worker.engine.wrap_once import wrap_once

log = logging.getLogger("pdspec.engine")

_IDLE_RANK_DUMMY = ContextVar("pdspec_idle_rank_dummy", default=False)
_WARMING_UP = ContextVar("pdspec_warming_up", default=False)


def install_idle_rank_vote(worker_cls: type, runner_cls: type, vote: bool = True) -> None:
    """Make an idle DP rank's dummy batch vote "skip drafts" on a prefill worker, and
    count the K each real step of the runner ran with (`pdspec_runner_*`).

    vLLM 0.33 ANDs `skip_drafts` across DP ranks that step together (MoE models; a dense
    model's ranks are independent engines); an idle rank runs a dummy batch whose empty
    SchedulerOutput votes False, so one idle rank makes every rank draft. Here the
    dummy batch of an idle rank (`Worker.execute_dummy_batch`, and only that one, not
    warm-up or profiling runs) votes with `dp_vote(False, ...)`; `vote=False` keeps
    vLLM's own vote (`dp_idle_rank_vote = false`, for A/B runs). Idempotent.
    """
    if not wrap_once(runner_cls, "execute_model", "dp_vote", lambda original: _voting_execute(original, vote)):
        return
    wrap_once(worker_cls, "execute_dummy_batch", "dp_vote_idle_dummy", lambda m: _flagged(m, _IDLE_RANK_DUMMY))
    # vLLM's kernel warm-up runs real-looking steps (not dummy runs) with K>0: not counted.
    wrap_once(worker_cls, "compile_or_warm_up_model", "dp_vote_warm_up", lambda m: _flagged(m, _WARMING_UP))


def _voting_execute(original_execute: Any, vote: bool) -> Any:
    @functools.wraps(original_execute)
    def execute_model(self, scheduler_output, *args, **kwargs):
        dummy = kwargs.get("dummy_run", False)
        if vote and dummy and _IDLE_RANK_DUMMY.get() and hasattr(scheduler_output, "skip_drafts"):
            scheduler_output.skip_drafts = dp_vote(rank_has_requests=False, rank_skips=False, prefill_role=True)
            _dummy_propose_follows_agreement(getattr(self, "speculator", None))
        before = getattr(self, "execute_model_state", None)
        result = original_execute(self, scheduler_output, *args, **kwargs)
        if not dummy and not _WARMING_UP.get():
            _count_runner_step(self, before)
        return result

    return execute_model


def _dummy_propose_follows_agreement(speculator: Any) -> None:
    """After its dummy batch, an idle rank runs the speculator's `propose` without a K,
    so with vLLM's full K: vLLM's own idle rank never lets the ranks agree to skip. With
    pdspec's vote they can; the busy ranks then run only the drafter's prefill pass, and
    the idle rank must run the same passes, since an MoE drafter's forward (MTP of an MoE
    target) has collectives that span the data-parallel group. Wraps this instance once
    (its own marker: the class's `propose` may carry the KV-only pass's)."""
    if speculator is not None:
        wrap_once(speculator, "propose", "dp_vote_follows_agreement", _following_agreement)


def _following_agreement(original: Any) -> Any:
    @functools.wraps(original)
    def propose(*args, **kwargs):
        agreed_skip = getattr(kwargs.get("dp_sync_state"), "skip_drafts", False)
        no_k = kwargs.get("num_speculative_tokens") is None
        if kwargs.get("dummy_run") and _IDLE_RANK_DUMMY.get() and agreed_skip and no_k:
            kwargs["num_speculative_tokens"] = 0
        return original(*args, **kwargs)

    return propose


def _flagged(method: Any, flag: ContextVar) -> Any:
    """`method`, with `flag` set to True while it runs (and what it calls)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        token = flag.set(True)
        try:
            return method(self, *args, **kwargs)
        finally:
            flag.reset(token)

    return wrapper


def _count_runner_step(runner: Any, state_before: Any) -> None:
    """The V2 runner keeps the step's K (after the DP agreement) in a new
    `execute_model_state`; a step without a forward (nothing scheduled) makes none."""
    state = getattr(runner, "execute_model_state", None)
    if state is None or state is state_before or getattr(runner, "speculator", None) is None:
        return
    if _tensor_parallel_rank() != 0:  # every TP rank runs the step; count it once
        return
    k = getattr(state, "num_spec_tokens_to_schedule", None)
    if k is None:
        return
    RUNNER_PROPOSALS.inc()
    if k == 0:
        RUNNER_K0_PROPOSALS.inc()


def _tensor_parallel_rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # no TP group (stand-ins, or before vLLM set it up): a single rank
        return 0


def install_dp_vote() -> None:
    """On a prefill worker's GPU processes: the idle-rank vote on the V2 runner (reported as
    the `dp_idle_rank_vote` engine feature; off where there is no V2 runner)."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            features.report(features.DP_IDLE_RANK_VOTE, False, "vLLM's V2 runner, where ranks vote, runs on GPUs only")
            return
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2Runner
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError:
        features.report(features.DP_IDLE_RANK_VOTE, False, "this vLLM has no V2 runner")
        return
    vote = os.environ.get(DP_IDLE_RANK_VOTE_ENV, "1") != "0"
    install_idle_rank_vote(Worker, V2Runner, vote=vote)
    features.report(
        features.DP_IDLE_RANK_VOTE, vote, "" if vote else "turned off by its setting (dp_idle_rank_vote false)"
    )
