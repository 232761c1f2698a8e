"""`kv_aware`: the worker with the least prefill work ahead of the prompt, and the load
that routing counts.

The work ahead on a worker: the prompt tokens its prefix cache lacks (the proxy's index of
the workers' KV events, proxy/routing/kv_router.py), plus the uncached prompt tokens of the
prefill legs it is already running (`Worker.pending_tokens`), plus `load_tokens` for each
leg in flight (a leg's fixed cost). On the decode pool `pending_tokens` are the prompt
tokens its decode legs hold in its KV cache (a decode worker takes a new leg at once only
while it has room; a leg it holds the prompt of saves only part of a transfer), each leg's
whole prompt, though legs sharing a prefix hold its blocks once (a busy holder of a shared
prefix looks busier than it is). Pending tokens that build this prompt's own blocks (a
burst's first leg, still computing the prefix the others were routed after) are not
counted: the prompt would wait for them, or compute them again elsewhere. On the prefill
pool, the prompt's uncached tokens also cost `churn_weight` times the worker's share of
the pool's recent cache churn (the uncached tokens its prefill legs computed, halving
every CHURN_HALF_LIFE_S), times the pool's size: storing new blocks evicts the least
recently used ones, and those are younger, so worth more, on a worker that stored more
lately. A hit stores little and barely pays; a miss goes to the worker whose cache it
disturbs least, so new prefixes spread instead of all following a short prefix (a system
prompt) that one worker holds. Two side effects, measured with as they are: at an even
share the term is `churn_weight * uncached`, so cached tokens weigh 1 + churn_weight
against load; and its largest difference grows with the pool's size (n times the uncached
tokens). Ties go to the less loaded worker, then to the prompt's rendezvous hash (its
first block no worker holds; with nothing cached anywhere, prefix affinity among the least
loaded). The same guard as prefix_affinity keeps a hot prefix from piling onto one worker.

The weights come from the registry (proxy/routing/registry.py): `load_tokens` on both
pools, `churn_weight` on the prefill pool only (churn is what prefill legs compute; a
decode worker's cache fills with what it pulls, chosen by its load).

The load accounting: what a leg leases of its worker while it runs (`uncached_tokens` for
a prefill leg, `decode_tokens` for a decode leg, from the route plan), which the score
above reads back as `pending_tokens`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.fleet.pool import Worker
from proxy.routing.keys import rendezvous
from proxy.routing.policy import AFFINITY_MAX_EXTRA_LOAD

if TYPE_CHECKING:
    from proxy.routing.plan import RoutePlan


class KvAware:
    name = "kv_aware"
    keyed = True
    cache_aware = True
    reads_load = True

    def __init__(self, load_tokens: int = 256, churn_weight: float = 0.0) -> None:
        self.load_tokens = load_tokens  # what one leg in flight costs, in prompt tokens to prefill
        self.churn_weight = churn_weight  # what storing an uncached token costs, at an even share of churn

    def pick(
        self,
        candidates: list[Worker],
        key: str | None,
        cached: dict[str, int],
        building: dict[str, int],
        prompt_tokens: int,
    ) -> Worker:
        """Compares `cached - max(0, pending_tokens - building) - load_tokens * outstanding -
        churn_weight * uncached * n * churn share`: without the churn term the same order as
        least work ahead, since the prompt's length is the same on every worker."""
        key = key or ""
        churn = {w.url: w.churn.value() for w in candidates}
        total = sum(churn.values())

        def score(w: Worker) -> tuple:
            ahead = work_ahead(w, building, self.load_tokens)
            # n * share is 1 at an even share (and while nothing has churned).
            pressure = len(candidates) * churn[w.url] / total if total else 1.0
            stored = max(0, prompt_tokens - cached.get(w.url, 0))
            return (
                cached.get(w.url, 0) - ahead - self.churn_weight * stored * pressure,
                -w.outstanding,
                rendezvous(key, w.url),
            )

        best = max(candidates, key=score)
        least = min(candidates, key=lambda w: w.outstanding)
        return best if best.outstanding - least.outstanding < AFFINITY_MAX_EXTRA_LOAD else least


def work_ahead(worker: Worker, building: dict[str, int], load_tokens: int) -> int:
    """The work a worker's legs in flight put ahead of a prompt, in prompt tokens: the
    tokens they lease (`pending_tokens`) less those `building` this prompt's own blocks, plus
    `load_tokens` per leg (a leg's fixed cost). The prompt's own uncached part is not in it."""
    return max(0, worker.pending_tokens - building.get(worker.url, 0)) + load_tokens * worker.outstanding


def uncached_tokens(plan: RoutePlan | None, worker: Worker) -> int:
    """The prompt tokens a prefill leg makes `worker` compute, by the route plan (0: no
    plan, or not kv_aware), which kv_aware routing counts as that worker's load."""
    if plan is None or plan.prefill_cached is None:
        return 0
    return max(0, plan.prompt_tokens - plan.prefill_cached.get(worker.url, 0))


def decode_tokens(plan: RoutePlan | None) -> int:
    """The prompt tokens a decode leg holds in its worker's KV cache while it runs (the
    whole prompt, pulled or cached), by the route plan (0: no plan, or the decode pool not
    kv_aware), which kv_aware counts as that decode worker's load: a decode worker serves
    a new leg at once only while its cache has room for it."""
    if plan is None or plan.decode_cached is None:
        return 0
    return plan.prompt_tokens
