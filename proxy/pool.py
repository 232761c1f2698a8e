"""Worker pools: which prefill and which decode worker serves a request."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass
class Worker:
    url: str
    outstanding: int = 0


@dataclass
class WorkerPool:
    """Round-robin over a static list of workers."""

    name: str
    workers: list[Worker]
    _cycle: itertools.cycle = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError(f"the {self.name} pool has no workers")
        self._cycle = itertools.cycle(self.workers)

    @classmethod
    def from_urls(cls, name: str, urls: list[str]) -> WorkerPool:
        return cls(name, [Worker(url.rstrip("/")) for url in urls])

    def pick(self) -> Worker:
        return next(self._cycle)
