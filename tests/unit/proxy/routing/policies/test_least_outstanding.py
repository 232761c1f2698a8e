"""`least_outstanding`, power of two choices (proxy/routing/policies/least_outstanding.py)."""

from proxy.fleet.pool import WorkerPool
from proxy.routing import registry


def pool(n=4):
    return WorkerPool.from_urls(
        "prefill", [f"http://10.0.0.{i}:8100" for i in range(n)], registry.make("least_outstanding")
    )


def test_least_outstanding_avoids_the_busy_worker():
    p = pool(2)
    p.workers[0].outstanding = 10
    assert {p.pick().url for _ in range(20)} == {p.workers[1].url}
