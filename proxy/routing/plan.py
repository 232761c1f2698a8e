"""A request's route plan, from cache-aware routing (proxy/routing/kv_router.py makes it):
the prompt's blocks and length, what each worker holds of it, the decode worker chosen
first, the rendezvous keys, and the P/D decision (conditional disaggregation: whether the
decode worker prefills the prompt itself, `local_prefill`, or, when no decode worker has
KV room for it, a prefill worker serves it whole, `decode_full_on`). Also the rendezvous
key a leg is routed by, plan or not (`leg_key`), what a decode leg without KV leases of its
worker as prefill work (`local_prefill_tokens`), what any leg leases of its worker's KV
(`kv_held_tokens`), and what a disaggregated request leases of the decode pool's KV until
its decode leg starts (`pending_decode_tokens`).

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
    # Conditional disaggregation's decode worker, chosen first (None otherwise): the decode
    # leg goes there when it prefills the prompt itself, or when its pool reads no load.
    decode_worker: Worker | None = None
    # The rendezvous keys, from the ids (the same whatever API rendered them): `affinity`,
    # their start, for prefix_affinity (a prefix stays on one worker); `new_part`, the
    # prompt's first block no worker holds, kv_aware's tie-break (new_part_key).
    affinity: str | None = None
    new_part: str | None = None
    # Why the worker that decodes prefills the prompt itself (None: disaggregate): the decode
    # worker (cached_on_decode, short_prompt, prefill_queue), or `whole_on` (decode_full).
    local_prefill: str | None = None
    # Of prefill_cached, the tokens a worker holds by a routing note only: a leg of an
    # earlier request is computing them there now (or just did). kv_aware does not count
    # that leg's pending tokens against this prompt, which would wait for them anyway.
    prefill_building: dict[str, int] | None = None
    # Conditional disaggregation: the prompt tokens decode_worker lacks by its own KV events
    # (None: not looked up), what it prefills if it serves the prompt without KV.
    decode_uncached: int | None = None
    # decode_full: the prefill worker that serves the request whole (prefill and decode, no
    # KV transfer), because no decode worker has KV room for the prompt (`decode_full_on`).
    whole_on: Worker | None = None

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


def local_prefill(
    prompt_tokens: int,
    held: int,
    max_tokens: int,
    prefill_ahead: int | None = None,
    decode_ahead: int = 0,
) -> str | None:
    """Conditional disaggregation's decision: why the decode worker prefills the prompt itself
    (`cached_on_decode`, `short_prompt`, `prefill_queue`), or None to disaggregate.

    `held`: the prompt tokens the decode worker's own KV events say it holds; local when the
    part it lacks is shorter than `max_tokens` (`local_prefill_max_tokens`). Else, when
    `prefill_ahead` is given (the prefill pool's work ahead of the prompt, in prompt tokens
    to prefill: the prompt's own uncached part, the legs queued there and the hand-off; see
    KvRouter.prefill_work_ahead), local when it exceeds the decode worker's work ahead by
    more than `max_tokens`: its `decode_ahead` (what its local prefills in flight are still
    computing) plus the part of the prompt it lacks. Both pools run the same engine, so
    their tokens compare directly; the margin keeps the decode worker, whose decodes a
    prefill slows, from taking a prompt over a small difference. None for `prefill_ahead`:
    no queue to weigh (a prefill worker is idle, the prefill pool has no load accounting,
    or the setting is off), the length rule alone. `max_tokens` 0: never local, as before the
    queue rule (a margin of 0 would send every long prompt local whenever the prefill pool
    has a queue at all)."""
    if max_tokens == 0:
        return None
    cached = min(held, prompt_tokens)
    lacks = prompt_tokens - cached
    if lacks < max_tokens:
        return "cached_on_decode" if cached else "short_prompt"
    if prefill_ahead is not None and prefill_ahead - (decode_ahead + lacks) > max_tokens:
        return "prefill_queue"
    return None


def local_prefill_tokens(plan: RoutePlan | None, worker: Worker) -> int:
    """The prompt tokens a decode leg without KV (a local prefill, a decode-only request, a
    fallback) makes `worker` prefill, which it leases as `Worker.local_prefill_tokens`
    until its first token: what the planned decode worker lacks by its events, the whole
    prompt on another (a retry's, or a decode-only or fallback leg's picked when it left:
    what that worker holds was not looked up, so the lease errs high); 0 without a plan that
    looked (not conditional disaggregation, where nothing reads them)."""
    if plan is None or plan.decode_uncached is None:
        return 0
    return plan.decode_uncached if worker is plan.decode_worker else plan.prompt_tokens


def kv_held_tokens(plan: RoutePlan | None) -> int:
    """The tokens a leg holds in its worker's KV cache while it runs, as conditional
    disaggregation counts them (`Worker.kv_held_tokens`, which `decode_full_on` reads): the
    prompt's, for a prefill leg, a decode leg (either pool's) and a request served whole; 0
    without a plan or without conditional disaggregation (no decode worker chosen first),
    where nothing reads them. The tokens it generates are not counted: a bound on them is
    not cheap to know (a chat's max_tokens defaults to the context's rest) and they are
    few beside the prompt (48 of 4.4k in the fleet benchmark). Each leg counts a prefix it
    shares with others, which the engine holds once (the count errs high), and a prefill's
    KV kept for its hand-off after the leg ends is not counted (the decode leg reads it a
    moment later)."""
    if plan is None or plan.decode_worker is None:
        return 0
    return plan.prompt_tokens


def pending_decode_tokens(plan: RoutePlan | None) -> int:
    """The prompt tokens a request planned disaggregated under conditional disaggregation (a
    decode worker chosen first, no reason to prefill where it decodes, `local_prefill` None,
    so no `whole_on` either) will hold in a decode worker's KV once its decode leg starts,
    which the decode pool counts as pending (`WorkerPool.decode_pending_tokens`) while its
    prefill leg runs; 0 for any other plan, or none. The caller counts only a request it
    disaggregates (not one decode-only for its own reason)."""
    if plan is None or plan.decode_worker is None or plan.local_prefill is not None:
        return 0
    return plan.prompt_tokens


def kv_room(worker: Worker, prompt_tokens: int, share: float = 1.0) -> float | None:
    """What would be left of `share` of the worker's KV cache, in tokens, with the prompt
    beside the tokens its legs hold (negative: no room); None: its size is unknown."""
    if worker.kv_tokens is None:
        return None
    return worker.kv_tokens * share - worker.kv_held_tokens - prompt_tokens


def decode_full_on(
    prompt_tokens: int,
    decode_workers: list[Worker],
    prefill_workers: list[Worker],
    decode_share: float = 1.0,
    pending_tokens: int = 0,
    prefill_share: float = 1.0,
) -> Worker | None:
    """Conditional disaggregation's other direction (reason `decode_full`): the prefill worker
    that serves a request whole, prefill and decode, because no decode worker has KV room for
    its prompt; None to decide as before (the decode pool has room, or no prefill worker
    has). One line: a request that would wait for decode KV is decoded where there is KV.

    Room is the proxy's own count (`kv_room`): the prompt tokens a worker's legs in flight
    hold (`kv_held_tokens`: its decode legs; on a prefill worker also its prefill legs and
    the requests it serves whole) plus this prompt, against its KV size. Full: every one of
    `decode_workers` (the healthy ones) lacks room, not only the one the plan picked: a
    disaggregated request's decode leg is picked again at its hand-off where the pool reads
    load, so a worker with room would take it, and a request waits for decode KV only when
    none has room. A worker whose size is unknown is never full, so one such decode worker
    keeps the rule off, and never serves a request whole. Of the prefill workers with room,
    the one with the most (then the fewest legs in flight): the decodes, which slow a
    prefill worker's steps, spread over the pool as its KV allows. `decode_share`
    (`routing.decode_full_share`): the share of a decode worker's KV the count may fill
    before it is full; `prefill_share` (`routing.decode_full_prefill_share`): the share of a
    prefill worker's KV that its count, with this prompt, may fill (below 1: room kept for its
    prefill legs, which took 1.6-3.6 s in round 5 beside seven requests served whole that left
    2.3k tokens of room by this count).

    `pending_tokens` (`routing.decode_full_counts_pending`; the decode pool's
    `decode_pending_tokens`): the prompt tokens of the requests planned disaggregated whose
    decode leg has not started, which no decode worker's count holds yet. With some, the
    decode pool is also full when its room (over `decode_workers`, each worker's
    `decode_share` of its size less what it holds, none below 0) less those tokens is short
    of this prompt: they arrive at the hand-off about a prefill leg from now and take that
    room first, so a burst planned on the room of before it would all wait there for decode
    KV (the H200 fleet's disaggregated requests at 11 QPS: TTFT p50 3.4-4.0 s behind a
    prefill leg of ~1 s, loadtest/results/fleet/h200-qwen3-8b/round5/). The pool's room is
    summed, not matched worker by worker: where each pending prompt will fit is the decode
    legs' pick at their hand-off, so this errs towards room (fragments that fit no prompt
    count), and a prompt pending for a worker since ejected still counts against the healthy
    ones' room (errs towards full). 0: exactly the rule without it (a pool with a worker that has room has at least
    this prompt's room in all)."""

    def full(worker: Worker, share: float = 1.0) -> bool:
        room = kv_room(worker, prompt_tokens, share)
        return room is not None and room < 0

    if not decode_workers:
        return None
    pool_full = all(full(w, decode_share) for w in decode_workers)
    if not pool_full and pending_tokens > 0 and all(w.kv_tokens is not None for w in decode_workers):
        room = sum(max(0.0, w.kv_tokens * decode_share - w.kv_held_tokens) for w in decode_workers)
        pool_full = room - pending_tokens < prompt_tokens
    if not pool_full:
        return None
    rooms = {w.url: kv_room(w, prompt_tokens, prefill_share) for w in prefill_workers}
    roomy = [w for w in prefill_workers if rooms[w.url] is not None and rooms[w.url] >= 0]
    return max(roomy, key=lambda w: (rooms[w.url], -w.outstanding), default=None)
