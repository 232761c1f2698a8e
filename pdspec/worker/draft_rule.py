"""When may a step propose with K=0? The rule, as pure functions (no vLLM import).

A step's drafts are verified in the request's next step. They are of no use to a
request that will not sample in this step (a non-final prefill chunk) or that is sure
to be finished by this step's token (it reaches `max_tokens`). A step proposes with K=0
only when that holds for every scheduled request: one request that can use drafts keeps
K for the whole batch, so no draft that a later step could verify is ever skipped, and
outputs and acceptance stay exactly what they were.

"Sure" counts only tokens that will exist whatever the verifier does, assuming every
draft is rejected: the outputs already known, one for a step still in flight (async
scheduling runs one step ahead, so its token is not known yet but will come), and one
for this step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdspec.contract import DraftsPolicy  # the rule's policy type, typed once


@dataclass(frozen=True)
class ScheduledRequest:
    """What the rule needs to know of one request scheduled in this step."""

    num_computed_tokens: int  # before this step
    num_scheduled_tokens: int  # this step, spec tokens to verify included
    num_tokens: int  # prompt + known outputs
    num_output_placeholders: int  # async scheduling: tokens of in-flight steps, not yet known
    num_output_tokens: int  # known outputs
    max_tokens: int


def samples_this_step(request: ScheduledRequest) -> bool:
    """False for a non-final prefill chunk: it stops before the last known token.

    The same test as vLLM 0.33's `Scheduler._drafts_unused`, so both builds agree."""
    return request.num_computed_tokens + request.num_scheduled_tokens >= request.num_tokens


def sure_outputs_after_step(request: ScheduledRequest) -> int:
    in_flight_step = 1 if request.num_output_placeholders > 0 else 0
    return request.num_output_tokens + in_flight_step + 1


def can_use_drafts(request: ScheduledRequest) -> bool:
    if not samples_this_step(request):
        return False
    return sure_outputs_after_step(request) < request.max_tokens


def propose_with_k0(requests: Iterable[ScheduledRequest], policy: DraftsPolicy) -> bool:
    """True when this step should propose with K=0 instead of K."""
    if policy == "always":
        return False
    requests = list(requests)
    return bool(requests) and not any(can_use_drafts(r) for r in requests)


def dp_vote(rank_has_requests: bool, rank_skips: bool, prefill_role: bool) -> bool:
    """One data-parallel rank's vote on skipping drafts; ranks AND their votes.

    An idle rank runs a dummy batch. vLLM lets that dummy batch vote "draft", so one
    idle rank makes every rank draft. On a prefill worker every real request skips,
    so an idle rank votes "skip" there and the busy ranks keep their K=0.
    """
    if not rank_has_requests:
        return prefill_role
    return rank_skips
