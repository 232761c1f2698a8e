"""Active health checks: eject a worker after failed checks, re-admit it after good ones,
and admit only workers whose config may be paired (pairing.py).

Each round probes every worker at once (I/O: /health, and /metrics when the worker's
`pdspec_worker_info` is due; its KV size is read from the same text), then applies all results in one synchronous step, so no
request is routed by a decision half made. A check that timed out while the proxy's own
event loop was blocked (proxy/loop_lag.py) is not counted either way.

Failure policy: a probe that raises anything but the worker client's own error (its
/health call, or reading its info) is a bug here, not the worker's answer: logged and
counted as a failed check of that worker alone; the rounds go on whatever one raises.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from pdspec.settings import HealthSettings
from proxy.fleet.pairing import Pairing
from proxy.fleet.pool import Worker, WorkerPool
from proxy.fleet.worker_info import InfoUnreadable, fetch_worker_info
from proxy.loop_lag import LoopLag
from proxy.upstream.client import UpstreamClient, UpstreamError

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
        pairing: Pairing | None = None,
        info_interval_s: float = 30.0,
        loop_lag: LoopLag | None = None,
        on_discarded=lambda: None,
        after_round: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.pools = pools
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.eject_after = eject_after
        self.readmit_after = readmit_after
        self.pairing = pairing or Pairing()
        self.info_interval_s = info_interval_s
        self.loop_lag = loop_lag
        self.on_discarded = on_discarded
        self.after_round = after_round  # sees each round's decisions (cache-aware routing's subscriptions)
        self._raised: set[str] = set()  # workers whose last probe raised (its traceback logged)

    @classmethod
    def from_settings(
        cls,
        client: UpstreamClient,
        pools: list[WorkerPool],
        settings: HealthSettings,
        pairing: Pairing | None = None,
        loop_lag: LoopLag | None = None,
        on_discarded=lambda: None,
        after_round: Callable[[], None] | None = None,
    ) -> HealthChecker:
        """The checker the `health` group describes, over `pools` (the pairing check is built
        from the same group: Pairing.from_settings)."""
        return cls(
            client,
            pools,
            settings.interval_s,
            settings.timeout_s,
            settings.eject_after_failures,
            settings.readmit_after_successes,
            pairing,
            settings.worker_info_interval_s,
            loop_lag,
            on_discarded,
            after_round,
        )

    async def probe(self, worker: Worker) -> bool | None:
        """True: healthy; False: failed; None: timed out while the proxy's own event loop
        was blocked for half the timeout or more, which says nothing about the worker. A
        probe that raises (a bug here, not the worker's answer) is a failed check, logged
        with its traceback the first time in a row for that worker."""
        try:
            ok = await self._probe(worker)
        except Exception as exc:  # noqa: BLE001
            if worker.url in self._raised:
                log.warning("health check of %s raised again: %r", worker.url, exc)
            else:
                self._raised.add(worker.url)
                log.exception("health check of %s raised", worker.url)
            return False
        self._raised.discard(worker.url)
        return ok

    async def _probe(self, worker: Worker) -> bool | None:
        started = time.monotonic()
        try:
            resp = await self.client.request(worker.url, "GET", "/health", timeout_s=self.timeout_s)
            await resp.read()
            ok = resp.status == 200
        except UpstreamError as exc:
            if exc.reason == "timeout" and self._loop_stalled(started):
                log.warning(
                    "health check of %s timed out while the proxy's event loop was blocked (%.1f s); not counted",
                    worker.url,
                    self.loop_lag.worst_since(started),
                )
                self.on_discarded()
                return None
            ok = False
        # Read its info when it joins, when it answers again after a failed check (it may
        # be another process now, with another config), and every info_interval_s.
        returning = worker.consecutive_failures > 0
        if ok and (returning or self._info_due(worker)):
            await self.read_info(worker, must_read=returning)
        return ok

    def _loop_stalled(self, since: float) -> bool:
        return self.loop_lag is not None and self.loop_lag.stalled_since(since, self.timeout_s / 2)

    def _info_due(self, worker: Worker) -> bool:
        return worker.info_read_at is None or time.monotonic() - worker.info_read_at >= self.info_interval_s

    async def read_info(self, worker: Worker, must_read: bool = False) -> None:
        """`must_read`: the info it had may be stale, so if it cannot be read now the
        worker waits (not admitted) rather than keep it."""
        first_read = worker.info_read_at is None
        try:
            info, features_off, kv_tokens = await fetch_worker_info(self.client, worker.url, self.timeout_s)
        except InfoUnreadable as exc:
            if worker.info_error is None:
                log.warning("cannot read pdspec_worker_info of %s (%s); not admitted until it is read", worker.url, exc)
            worker.info_error = str(exc)
            if must_read:
                worker.info_read_at = None
            return  # a periodic re-read that failed keeps the info it had
        if info is None and (first_read or worker.info is not None):
            log.warning(
                "worker %s exports no pdspec_worker_info (plain vLLM?): its config cannot be checked against "
                "the other pool's",
                worker.url,
            )
        worker.info, worker.info_read_at, worker.info_error = info, time.monotonic(), None
        worker.kv_tokens = kv_tokens
        if features_off != worker.features_off and features_off:
            log.warning(
                "worker %s runs with engine features off: %s",
                worker.url,
                "; ".join(f"{name} ({reason})" for name, reason in features_off.items()),
            )
        worker.features_off = features_off

    def record(self, pool: WorkerPool, worker: Worker, ok: bool | None) -> None:
        if ok is None:  # inconclusive (see probe)
            return
        if ok:
            worker.consecutive_failures = 0
            worker.consecutive_successes += 1
            if not worker.healthy and not worker.seen_healthy:
                worker.healthy = worker.seen_healthy = True  # a new member: admit at once
                log.info("%s worker %s is up", pool.name, worker.url)
            elif not worker.healthy and worker.consecutive_successes >= self.readmit_after:
                worker.healthy = True
                log.warning("re-admitted %s worker %s", pool.name, worker.url)
        else:
            worker.consecutive_successes = 0
            worker.consecutive_failures += 1
            if worker.healthy and worker.consecutive_failures >= self.eject_after:
                worker.healthy = False
                worker.kv_source = None  # it may come back as another engine
                log.warning("ejected %s worker %s", pool.name, worker.url)

    async def check(self, pool: WorkerPool, worker: Worker) -> None:
        self.record(pool, worker, await self.probe(worker))
        self._decided()

    async def check_all(self) -> None:
        checked = [(pool, w) for pool in self.pools for w in list(pool.workers)]
        results = await asyncio.gather(*(self.probe(w) for _, w in checked))
        for (pool, worker), ok in zip(checked, results):
            self.record(pool, worker, ok)
        self._decided()

    def _decided(self) -> None:
        self.pairing.update(self.pools)
        if self.after_round is not None:
            try:
                self.after_round()
            except Exception:  # noqa: BLE001 (routing state must never stop the health checks)
                log.exception("after a health round")

    async def run(self) -> None:
        """Rounds every `interval_s`, for good: a round that raises is logged and the next
        one runs (a dead loop would leave every pool as it was, dead workers in it)."""
        while True:
            try:
                await self.check_all()
            except Exception:  # noqa: BLE001
                log.exception("health round failed")
            await asyncio.sleep(self.interval_s)
