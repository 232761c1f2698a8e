"""`round_robin` (proxy/routing/policies/round_robin.py)."""

from proxy.fleet.pool import WorkerPool
from proxy.routing import registry


def pool(n=4):
    return WorkerPool.from_urls("prefill", [f"http://10.0.0.{i}:8100" for i in range(n)], registry.make("round_robin"))


def test_round_robin_visits_every_worker_in_turn():
    p = pool(3)
    assert [p.pick().url for _ in range(6)] == [w.url for w in p.workers] * 2
