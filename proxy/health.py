"""Active health checks: eject a worker after failed checks, re-admit it after good ones."""

from __future__ import annotations

import asyncio
import logging

from proxy.pool import Worker, WorkerPool
from proxy.upstream import UpstreamClient, UpstreamError

log = logging.getLogger("pdspec.proxy.health")


class HealthChecker:
    def __init__(
        self,
        client: UpstreamClient,
        pools: list[WorkerPool],
        interval_s: float,
        timeout_s: float,
        eject_after: int,
        readmit_after: int,
    ) -> None:
        self.client = client
        self.pools = pools
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.eject_after = eject_after
        self.readmit_after = readmit_after

    async def check(self, pool: WorkerPool, worker: Worker) -> None:
        try:
            resp = await self.client.request(worker.url, "GET", "/health", timeout_s=self.timeout_s)
            await resp.read()
            ok = resp.status == 200
        except UpstreamError:
            ok = False
        self.record(pool, worker, ok)

    def record(self, pool: WorkerPool, worker: Worker, ok: bool) -> None:
        if ok:
            worker.consecutive_failures = 0
            worker.consecutive_successes += 1
            if not worker.healthy and not worker.seen_healthy:
                worker.healthy = worker.seen_healthy = True  # a new member: admit at once
                log.info("admitted %s worker %s", pool.name, worker.url)
            elif not worker.healthy and worker.consecutive_successes >= self.readmit_after:
                worker.healthy = True
                log.warning("re-admitted %s worker %s", pool.name, worker.url)
        else:
            worker.consecutive_successes = 0
            worker.consecutive_failures += 1
            if worker.healthy and worker.consecutive_failures >= self.eject_after:
                worker.healthy = False
                log.warning("ejected %s worker %s", pool.name, worker.url)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(pool, w) for pool in self.pools for w in list(pool.workers)))

    async def run(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.interval_s)
