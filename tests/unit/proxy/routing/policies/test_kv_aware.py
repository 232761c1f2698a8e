"""`kv_aware` (proxy/routing/policies/kv_aware.py): cache against load and churn, its ties,
and the load a leg leases of its worker."""

import pytest

from proxy.fleet.pool import CHURN_HALF_LIFE_S, DecayingSum, Worker, WorkerPool
from proxy.routing import registry
from proxy.routing.plan import RoutePlan
from proxy.routing.policies.kv_aware import decode_tokens, uncached_tokens


def pool(*outstanding: int) -> WorkerPool:
    workers = [Worker(f"http://w{i}") for i in range(len(outstanding))]
    for worker, n in zip(workers, outstanding):
        worker.outstanding = n
    return WorkerPool("prefill", workers, registry.make("kv_aware", load_tokens=100))


@pytest.mark.parametrize(
    "outstanding, cached, expected",
    [
        ((0, 0, 0), {"http://w1": 400}, {1}),  # most cached
        ((0, 3, 0), {"http://w1": 400}, {1}),  # 400 cached beats 3 legs at 100 each
        ((0, 5, 0), {"http://w1": 400}, {0, 2}),  # not 5 legs: an idle one, by the prompt's hash
        ((2, 2, 0), {}, {2}),  # nothing cached: the least loaded
        ((0, 8, 0), {"http://w1": 10_000}, {0}),  # the load guard: 4 more in flight than the least loaded
    ],
)
def test_kv_aware_weighs_cache_against_load(outstanding, cached, expected):
    assert pool(*outstanding).pick(affinity_key="k", cached=cached).url in {f"http://w{i}" for i in expected}


def test_kv_aware_counts_the_uncached_tokens_of_the_legs_a_worker_runs():
    """Two legs each: the holder of 400 cached tokens still wins while its legs hit its
    cache, and loses once they are long misses it must compute first."""
    hits, misses = pool(2, 2, 2), pool(2, 2, 2)
    hits.workers[1].pending_tokens = 2 * 50
    misses.workers[1].pending_tokens = 2 * 800
    assert hits.pick(affinity_key="k", cached={"http://w1": 400}).url == "http://w1"
    assert misses.pick(affinity_key="k", cached={"http://w1": 400}).url != "http://w1"


def churned(*recent: float, weight: float = 0.5) -> WorkerPool:
    """A kv_aware prefill pool whose workers computed `recent` uncached tokens just now."""
    workers = pool(*([0] * len(recent)))
    workers.policy.churn_weight = weight
    for worker, tokens in zip(workers.workers, recent):
        worker.churn = DecayingSum(CHURN_HALF_LIFE_S, clock=lambda: 0.0)
        worker.churn.add(tokens)
    return workers


def test_a_miss_goes_to_the_worker_with_the_smaller_share_of_churn():
    system = {"http://w0": 128}  # only w0 holds the system prompt
    # Nothing churned yet: the system prompt's 128 tokens decide.
    assert churned(0, 0).pick(affinity_key="k", cached=system, prompt_tokens=1000).url == "http://w0"
    # w0 computed every miss lately: the next miss goes to w1.
    assert churned(3000, 0).pick(affinity_key="k", cached=system, prompt_tokens=1000).url == "http://w1"
    # ... but a prompt w0 holds most of still goes to w0: a hit stores little.
    assert churned(3000, 0).pick(affinity_key="k", cached={"http://w0": 900}, prompt_tokens=1000).url == "http://w0"
    # Weight 0: the term is off.
    assert churned(3000, 0, weight=0).pick(affinity_key="k", cached=system, prompt_tokens=1000).url == "http://w0"


def test_a_decode_worker_busy_with_a_prompt_loses_to_an_idle_one_holding_less():
    """Decode load is the KV its legs hold: the worker holding 900 tokens of the prompt but
    running one 960-token leg loses to an idle one holding the 128-token system prompt (one
    more leg would wait for room there; the cache saves only part of a transfer)."""
    decode = WorkerPool(
        "decode", [Worker("http://w0"), Worker("http://w1")], registry.make("kv_aware", load_tokens=256)
    )
    busy = decode.workers[0]
    cached = {"http://w0": 900, "http://w1": 128}
    assert decode.pick(affinity_key="k", cached=cached).url == "http://w0"
    with busy.lease(960):
        assert decode.pick(affinity_key="k", cached=cached).url == "http://w1"


def test_kv_aware_ties_go_to_the_prompts_rendezvous_hash():
    picks = {pool(0, 0, 0).pick(affinity_key=f"prompt {i}", cached={}).url for i in range(30)}
    assert len(picks) == 3  # spread over the workers by prompt
    assert {pool(0, 0, 0).pick(affinity_key="same", cached={}).url for _ in range(5)} == {
        pool(0, 0, 0).pick(affinity_key="same").url
    }


def test_a_prefill_leg_leases_the_tokens_the_plan_says_its_worker_lacks():
    worker = Worker("http://w1")
    plan = RoutePlan([], 1000, {"http://w1": 768}, None)
    assert uncached_tokens(plan, worker) == 232
    assert uncached_tokens(plan, Worker("http://w2")) == 1000
    assert uncached_tokens(RoutePlan([], 1000, None, None), worker) == 0  # prefill pool not kv_aware
    assert uncached_tokens(None, worker) == 0


def test_a_decode_leg_leases_the_whole_prompt_when_the_decode_pool_is_kv_aware():
    assert decode_tokens(RoutePlan([], 1000, None, {"http://w1": 768})) == 1000
    assert decode_tokens(RoutePlan([], 1000, {"http://w1": 768}, None)) == 0  # decode pool not kv_aware
    assert decode_tokens(None) == 0
