"""Pools and routing policies, health ejection and re-admission (pure logic)."""

import pytest

from proxy.fleet.health import HealthChecker
from proxy.fleet.pool import NoHealthyWorker, WorkerPool, affinity_key


def pool(policy, n=4):
    return WorkerPool.from_urls("prefill", [f"http://10.0.0.{i}:8100" for i in range(n)], policy)


def test_round_robin_visits_every_worker_in_turn():
    p = pool("round_robin", 3)
    assert [p.pick().url for _ in range(6)] == [w.url for w in p.workers] * 2


def test_least_outstanding_avoids_the_busy_worker():
    p = pool("least_outstanding", 2)
    p.workers[0].outstanding = 10
    assert {p.pick().url for _ in range(20)} == {p.workers[1].url}


def test_prefix_affinity_is_sticky_and_spreads_keys():
    p = pool("prefix_affinity")
    chosen = {key: p.pick(affinity_key=key).url for key in (f"prompt {i}" for i in range(40))}
    assert all(p.pick(affinity_key=key).url == url for key, url in chosen.items())
    assert len(set(chosen.values())) >= 3


def test_prefix_affinity_leaves_an_overloaded_worker():
    p = pool("prefix_affinity", 2)
    preferred = p.pick(affinity_key="shared system prompt")
    preferred.outstanding = 50
    assert p.pick(affinity_key="shared system prompt") is not preferred


def test_unhealthy_and_excluded_workers_are_skipped():
    p = pool("round_robin", 2)
    p.workers[0].healthy = False
    assert {p.pick().url for _ in range(4)} == {p.workers[1].url}
    with pytest.raises(NoHealthyWorker):
        p.pick(exclude={p.workers[1].url})


def test_membership_change_keeps_known_workers_state():
    p = pool("round_robin", 2)
    p.workers[0].outstanding = 3
    p.set_urls([p.workers[0].url, "http://10.0.0.9:8100"])
    assert p.workers[0].outstanding == 3 and p.workers[1].url.endswith("9:8100")
    # A new member takes no traffic before its first good health check, then at once.
    assert not p.workers[1].healthy
    checker = HealthChecker(None, [p], interval_s=1, timeout_s=1, eject_after=2, readmit_after=3)
    checker.record(p, p.workers[1], ok=True)
    assert p.workers[1].healthy


def test_ejection_after_failures_and_readmission_after_successes():
    p = pool("round_robin", 1)
    checker = HealthChecker(None, [p], interval_s=1, timeout_s=1, eject_after=2, readmit_after=2)
    worker = p.workers[0]
    checker.record(p, worker, ok=False)
    assert worker.healthy  # one failed check is not enough
    checker.record(p, worker, ok=False)
    assert not worker.healthy
    checker.record(p, worker, ok=True)
    assert not worker.healthy
    checker.record(p, worker, ok=True)
    assert worker.healthy


def test_affinity_key_reads_prompts_and_chats():
    assert affinity_key({"prompt": "abc"}) == "abc"
    assert affinity_key({"prompt": [[1, 2], [3]]}) == "[1, 2]"
    assert affinity_key({"messages": [{"role": "user", "content": "x"}]}).startswith("[{")
    assert affinity_key({}) is None
