"""Which workers a leg is tried on, and the pause between tries. One retry loop for both
legs (proxy/flow/disagg.py); what a leg costs its worker is kv_aware's accounting
(proxy/routing/policies/kv_aware.py).

Failure policy: none here; the caller decides what a failed try means."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from proxy.fleet.pool import NoHealthyWorker, Worker, WorkerPool


def attempts(
    pool: WorkerPool,
    tries: int,
    affinity: str | None = None,
    cached: dict[str, int] | None = None,
    first: Worker | None = None,
    exclude: set[str] = frozenset(),
    building: dict[str, int] | None = None,
    prompt_tokens: int = 0,
) -> Iterator[tuple[int, Worker]]:
    """The workers a leg is tried on: up to `tries`, never the same one twice nor one of
    `exclude` (prefill workers without room: read at each pick, so the caller may update it
    between attempts), picked by the pool's policy when the
    attempt starts (so a retry sees health changes), the first one `first` when it is still
    healthy (the decode worker a route plan bound, or an early decode leg's). `cached`, `building` and `prompt_tokens` are kv_aware's
    (`WorkerPool.pick`). Ends early when no healthy worker is left to try; the caller stops
    once a try succeeds and pauses with `backoff` after a failure. A plain generator: left
    suspended, it is freed at once."""
    tried: set[str] = set()
    for attempt in range(tries):
        try:
            if attempt == 0 and first is not None and first in pool.healthy():
                worker = first
            else:
                worker = pool.pick(
                    affinity_key=affinity,
                    exclude=tried | set(exclude),
                    cached=cached,
                    building=building,
                    prompt_tokens=prompt_tokens,
                )
        except NoHealthyWorker:
            return
        tried.add(worker.url)
        yield attempt, worker


async def backoff(attempt: int, tries: int, base_s: float) -> None:
    """The pause after failed attempt `attempt` (doubling), none after the last one."""
    if attempt + 1 < tries:
        await asyncio.sleep(base_s * (2**attempt))
