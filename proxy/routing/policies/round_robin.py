"""`round_robin`: the candidates in turn."""

from __future__ import annotations

import itertools

from proxy.fleet.pool import Worker


class RoundRobin:
    name = "round_robin"
    keyed = False
    cache_aware = False
    reads_load = False

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(self, candidates: list[Worker], key, cached, building, prompt_tokens) -> Worker:
        return candidates[next(self._counter) % len(candidates)]
