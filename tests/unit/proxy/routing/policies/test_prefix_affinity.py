"""`prefix_affinity` (proxy/routing/policies/prefix_affinity.py)."""

from proxy.fleet.pool import WorkerPool
from proxy.routing import registry


def pool(n=4):
    return WorkerPool.from_urls(
        "prefill", [f"http://10.0.0.{i}:8100" for i in range(n)], registry.make("prefix_affinity")
    )


def test_prefix_affinity_is_sticky_and_spreads_keys():
    p = pool()
    chosen = {key: p.pick(affinity_key=key).url for key in (f"prompt {i}" for i in range(40))}
    assert all(p.pick(affinity_key=key).url == url for key, url in chosen.items())
    assert len(set(chosen.values())) >= 3


def test_prefix_affinity_leaves_an_overloaded_worker():
    p = pool(2)
    preferred = p.pick(affinity_key="shared system prompt")
    preferred.outstanding = 50
    assert p.pick(affinity_key="shared system prompt") is not preferred
