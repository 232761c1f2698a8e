"""The proxy's one retry loop for both legs (proxy/flow/attempts.py `attempts`, `backoff`), and
the worker lease that counts a leg open on a worker (proxy/fleet/pool.py)."""

from __future__ import annotations

import pytest

from proxy.fleet.pool import WorkerPool
from proxy.flow.attempts import attempts, backoff
from proxy.routing import registry


def pool(n: int, healthy: int | None = None) -> WorkerPool:
    p = WorkerPool.from_urls("decode", [f"http://w{i}:1" for i in range(n)], registry.make("round_robin"))
    for w in p.workers[healthy if healthy is not None else n :]:
        w.healthy = False
    return p


def test_each_attempt_takes_another_worker_and_stops_when_none_is_left():
    assert [(a, w.url) for a, w in attempts(pool(2), 3)] == [(0, "http://w0:1"), (1, "http://w1:1")]
    assert list(attempts(pool(3, healthy=0), 3)) == []
    assert len(list(attempts(pool(5), 2))) == 2


def test_a_worker_ejected_between_attempts_is_not_tried():
    p = pool(3)
    seen = []
    for _attempt, worker in attempts(p, 3):
        seen.append(worker.url)
        p.workers[2].healthy = False  # ejected while the first try ran
    assert "http://w2:1" not in seen


async def test_backoff_doubles_and_skips_the_last_pause(monkeypatch):
    pauses = []

    async def sleep(s):
        pauses.append(s)

    monkeypatch.setattr("proxy.flow.disagg.asyncio.sleep", sleep)
    for attempt in range(3):
        await backoff(attempt, 3, 0.05)
    assert pauses == pytest.approx([0.05, 0.1])


def test_a_lease_counts_one_open_leg_and_releases_once():
    worker = pool(1).workers[0]
    with worker.lease():
        assert worker.outstanding == 1
    assert worker.outstanding == 0
    lease = worker.lease()
    lease.release()
    lease.release()  # idempotent: a relay closed twice must not go negative
    assert worker.outstanding == 0
