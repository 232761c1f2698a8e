"""proxy/loop_lag.py and its use in proxy/fleet/health.py: a check that timed out because the
proxy's own loop was blocked is not counted against the worker; one that timed out on a
free loop is."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from proxy.fleet.health import HealthChecker
from proxy.fleet.pool import Worker, WorkerPool
from proxy.loop_lag import LoopLag
from proxy.upstream.client import UpstreamClient

TIMEOUT_S = 0.4


@pytest.fixture
def silent_worker():
    """A worker that accepts connections and never answers (a hung process)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def checker_for(url: str, loop_lag: LoopLag | None, discarded: list) -> tuple[HealthChecker, WorkerPool]:
    pool = WorkerPool("decode", [Worker(url)])
    client = UpstreamClient(1.0, 5.0, 65536, 1 << 20)
    checker = HealthChecker(
        client,
        [pool],
        1.0,
        TIMEOUT_S,
        eject_after=1,
        readmit_after=1,
        loop_lag=loop_lag,
        on_discarded=lambda: discarded.append(1),
    )
    return checker, pool


async def test_the_sampler_sees_a_blocked_loop():
    lag = LoopLag(interval_s=0.02)
    task = asyncio.create_task(lag.run())
    await asyncio.sleep(0.05)
    since = time.monotonic()
    assert lag.worst_since(since) < 0.1
    time.sleep(0.3)  # the loop blocked, as by a slow callback
    assert lag.worst_since(since) >= 0.25  # seen before the sampler wakes
    await asyncio.sleep(0.05)
    assert lag.worst_since(since) >= 0.25
    task.cancel()


async def test_a_timeout_during_a_blocked_loop_is_not_counted(silent_worker):
    lag = LoopLag(interval_s=0.02)
    sampler = asyncio.create_task(lag.run())
    discarded: list = []
    checker, pool = checker_for(silent_worker, lag, discarded)
    check = asyncio.create_task(checker.check_all())
    await asyncio.sleep(0.05)  # the probe is sent and waiting
    time.sleep(TIMEOUT_S + 0.2)  # the proxy's loop blocked past the probe's timeout
    await check
    assert pool.workers[0].healthy and pool.workers[0].consecutive_failures == 0
    assert discarded == [1]
    sampler.cancel()


async def test_a_timeout_on_a_free_loop_still_ejects(silent_worker):
    lag = LoopLag(interval_s=0.02)
    sampler = asyncio.create_task(lag.run())
    discarded: list = []
    checker, pool = checker_for(silent_worker, lag, discarded)
    await checker.check_all()
    assert not pool.workers[0].healthy
    assert discarded == []
    sampler.cancel()
