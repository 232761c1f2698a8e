"""The achievable-hit-rate reference: LRU caches of vLLM's eviction order, and the routers."""

from __future__ import annotations

import pytest

from loadtest.serving.lru_replay import LruBlockCache, reference, replay, unbounded_hit_rate
from proxy.routing.kv_index import block_keys

BS = 4


def ctx(tag: int, blocks: int) -> list[int]:
    return [tag * 1000 + i for i in range(blocks * BS)]


def test_hit_on_leading_blocks_only_and_eagle_gives_up_one():
    a = ctx(1, 3)
    b = a[:BS] + ctx(2, 2)  # shares only a's first block
    assert replay([a, a], BS, 1, 100)["hit_tokens"] == 3 * BS
    assert replay([a, b], BS, 1, 100)["hit_tokens"] == 1 * BS
    assert replay([a, a], BS, 1, 100, drop_last_block=True)["hit_tokens"] == 2 * BS
    assert replay([a, b], BS, 1, 100, drop_last_block=True)["hit_tokens"] == 0


def test_lru_evicts_the_least_recent_prompt_tail_first():
    cache = LruBlockCache(4)
    a, b = block_keys(ctx(1, 3), BS), block_keys(ctx(2, 2), BS)
    cache.store(a)
    cache.store(b)  # 5 blocks for 4: a's tail goes, its head stays
    assert cache.matched(a) == 2 and cache.matched(b) == 2
    cache.store(a[:2])  # a's head used again: b is now the oldest
    cache.store(block_keys(ctx(3, 2), BS))
    assert cache.matched(b) == 0 and cache.matched(a) == 2
    with pytest.raises(ValueError):
        LruBlockCache(0)


def test_routers_on_a_working_set_that_fits_the_fleet_but_not_one_worker():
    tenants = [ctx(t, 4) for t in range(4)]  # 16 blocks; two workers of 8 hold it only split
    order = [0, 1, 2, 3] * 10
    prompts, groups = [tenants[t] for t in order], order
    oracle = replay(prompts, BS, 2, 8, "oracle")
    pinned = replay(prompts, BS, 2, 8, "pinned", groups=groups)
    rr = replay(prompts, BS, 2, 8, "round_robin")
    # Split by tenant, each worker holds its two tenants: every prompt after the first four hits whole.
    assert pinned["hit_tokens"] == 36 * 4 * BS and oracle["hit_tokens"] == 36 * 4 * BS
    # Round robin sends tenants 0 and 2 to one worker, 1 and 3 to the other: here that splits too.
    assert rr["hit_rate"] == pinned["hit_rate"]
    # An order that round robin mixes: every worker sees every tenant, 16 blocks on 8: LRU keeps missing.
    mixed = [0, 1, 2, 3, 1, 0, 3, 2] * 5
    rr_mixed = replay([tenants[t] for t in mixed], BS, 2, 8, "round_robin")
    pinned_mixed = replay([tenants[t] for t in mixed], BS, 2, 8, "pinned", groups=mixed)
    assert rr_mixed["hit_rate"] < 0.2 < 0.85 < pinned_mixed["hit_rate"]
    with pytest.raises(ValueError):
        replay(prompts, BS, 2, 8, "pinned")
    with pytest.raises(ValueError):
        replay(prompts, BS, 2, 8, "nearest")


def test_unbounded_and_reference_after_a_warm_up():
    tenants = [ctx(t, 4) for t in range(3)]
    order = [0, 1, 2, 0, 1, 2]
    prompts = [tenants[t] for t in order]
    assert unbounded_hit_rate(prompts, BS) == pytest.approx(0.5)
    assert unbounded_hit_rate(prompts, BS, drop_last_block=True) == pytest.approx(0.5 * 3 / 4)
    ref = reference(prompts, order, BS, capacity_blocks=100, workers=[1, 3], measured_from=3)
    # After the warm-up every later prompt is cached whole, on any worker count and router that follows it.
    assert ref["unbounded"]["plain"] == pytest.approx(1.0)
    assert ref["by_workers"]["1"]["plain"]["oracle"] == pytest.approx(1.0)
    assert ref["by_workers"]["3"]["eagle"]["pinned"] == pytest.approx(0.75)
    assert ref["by_workers"]["3"]["plain"]["achievable"] == pytest.approx(1.0)
    # Round robin over 3 workers puts each tenant on one worker here (3 tenants in turn): it hits too.
    assert ref["by_workers"]["3"]["plain"]["round_robin"] == pytest.approx(1.0)
