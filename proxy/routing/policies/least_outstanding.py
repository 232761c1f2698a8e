"""`least_outstanding`: power of two choices on in-flight legs (`Worker.outstanding`).

Two candidates drawn at random, the one with fewer legs in flight wins: cheap and close to
the true least-loaded worker, without herding every request onto one worker (as always
taking the least loaded would, between two updates of the counts).
"""

from __future__ import annotations

import random

from proxy.fleet.pool import Worker


class LeastOutstanding:
    name = "least_outstanding"
    keyed = False
    cache_aware = False
    reads_load = True

    def __init__(self) -> None:
        self._rng = random.Random(0)

    def pick(self, candidates: list[Worker], key=None, cached=None, building=None, prompt_tokens=0) -> Worker:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(candidates, 2)
        return a if a.outstanding <= b.outstanding else b
