"""The routing policy boundary: which worker of a pool serves one leg.

A pool (proxy/fleet/pool.py) holds one policy, built for it by the registry
(proxy/routing/registry.py) with its weights, and hands it the candidates: the pool's
healthy, admitted workers, less those excluded (tried already, or without KV room). A
policy keeps its own state (a turn counter, a random source), so each pool gets a policy
of its own. One module per policy, under proxy/routing/policies/.

What a policy is told of the prompt: `key`, its rendezvous key (a policy that is not
`keyed` gets none worth reading); `cached`, the prompt tokens each candidate holds, and
`building`, of those, the ones a leg in flight there is computing (a `cache_aware` policy's:
the route plan, proxy/routing/plan.py; empty otherwise); `prompt_tokens`, its length.

Failure policy: none; `pick` returns one of its candidates, which are never empty (the
pool raises NoHealthyWorker before it asks).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from proxy.fleet.pool import Worker

# Leave the preferred worker (prefix_affinity, kv_aware) when it has this many more legs in
# flight than the least loaded one.
AFFINITY_MAX_EXTRA_LOAD = 4


class Policy(Protocol):
    name: ClassVar[str]  # as the settings name it (pdspec.contract.RoutingPolicy)
    keyed: ClassVar[bool]  # routes by the prompt's rendezvous key: the flow computes it only then
    cache_aware: ClassVar[bool]  # reads the route plan's cached tokens; its key is the prompt's new part
    # Reads the workers' loads (legs in flight, leased tokens), which change between a
    # request's arrival and its hand-off: a decode worker is then picked at the hand-off.
    reads_load: ClassVar[bool]

    def pick(
        self,
        candidates: list[Worker],
        key: str | None,
        cached: dict[str, int],
        building: dict[str, int],
        prompt_tokens: int,
    ) -> Worker: ...
