"""A request's route plan, from cache-aware routing (proxy/routing/kv_router.py makes it):
the prompt's blocks and length, what each worker holds of it, the decode worker chosen
first, the rendezvous keys, and the P/D decision (conditional disaggregation: whether the
decode worker prefills the prompt itself). Also the rendezvous key a leg is routed by,
plan or not (`leg_key`).

Failure policy: none here; without a plan a request is routed by load and the body's key,
and disaggregated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.fleet.pool import Worker
from proxy.routing.keys import affinity_key, rendezvous_key
from proxy.routing.policy import Policy


@dataclass(frozen=True, slots=True)
class RoutePlan:
    keys: list[bytes]  # the prompt's full blocks, keyed as the index keys them
    prompt_tokens: int
    prefill_cached: dict[str, int] | None  # cached prompt tokens per prefill worker (None: not kv_aware)
    decode_cached: dict[str, int] | None
    decode_worker: Worker | None = None  # chosen first: the decode leg tries it first
    # The rendezvous keys, from the ids (the same whatever API rendered them): `affinity`,
    # their start, for prefix_affinity (a prefix stays on one worker); `new_part`, the
    # prompt's first block no worker holds, kv_aware's tie-break (new_part_key).
    affinity: str | None = None
    new_part: str | None = None
    local_prefill: str | None = None  # why the decode worker prefills itself (None: disaggregate)
    # Of prefill_cached, the tokens a worker holds by a routing note only: a leg of an
    # earlier request is computing them there now (or just did). kv_aware does not count
    # that leg's pending tokens against this prompt, which would wait for them anyway.
    prefill_building: dict[str, int] | None = None

    def key(self, policy: Policy) -> str | None:
        """The rendezvous key a pool of `policy` routes this prompt by."""
        return rendezvous_key(policy, self.affinity, self.new_part)


def leg_key(body: dict[str, Any], plan: RoutePlan | None, policy: Policy) -> str | None:
    """The rendezvous key of a leg on a pool of `policy` (None: a policy that routes by no
    key): from the prompt's token ids when the route plan read them (a Messages `system`,
    which the body's key leaves out, included; for kv_aware, the prompt's first block no
    worker holds), else from the body."""
    if not policy.keyed:
        return None
    key = plan.key(policy) if plan is not None else None
    return key if key is not None else affinity_key(body)


def local_prefill(prompt_tokens: int, held: int, max_tokens: int) -> str | None:
    """Conditional disaggregation's decision: why the decode worker prefills the prompt itself
    (`cached_on_decode`, `short_prompt`), or None to disaggregate. `held`: the prompt tokens
    the decode worker's own KV events say it holds; local when the part it lacks is shorter
    than `max_tokens` (`local_prefill_max_tokens`)."""
    cached = min(held, prompt_tokens)
    if prompt_tokens - cached < max_tokens:
        return "cached_on_decode" if cached else "short_prompt"
    return None
