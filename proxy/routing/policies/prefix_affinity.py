"""`prefix_affinity` (prefill only): rendezvous hashing of the prompt's start, so requests
sharing a prefix land on the worker whose prefix cache holds it; falls back to least
outstanding when that worker is much busier than the rest (AFFINITY_MAX_EXTRA_LOAD more
legs in flight), and when the request has no key.

The key is the body's (`keys.affinity_key`: its first characters) or, where the route plan
read the prompt's token ids, their start (`keys.token_affinity_key`).
"""

from __future__ import annotations

from proxy.fleet.pool import Worker
from proxy.routing.keys import rendezvous
from proxy.routing.policies.least_outstanding import LeastOutstanding
from proxy.routing.policy import AFFINITY_MAX_EXTRA_LOAD


class PrefixAffinity:
    name = "prefix_affinity"
    keyed = True
    cache_aware = False
    reads_load = True

    def __init__(self) -> None:
        self._least = LeastOutstanding()

    def pick(self, candidates: list[Worker], key: str | None, cached=None, building=None, prompt_tokens=0) -> Worker:
        least = self._least.pick(candidates)
        if key:
            preferred = max(candidates, key=lambda w: rendezvous(key, w.url))
            if preferred.outstanding - least.outstanding < AFFINITY_MAX_EXTRA_LOAD:
                return preferred
        return least
