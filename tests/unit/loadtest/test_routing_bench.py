"""routing_bench's workload figures (the ideal hit rate, a balanced affinity router's on small caches), the Rust
router's command line, the policy and workload choice, the warm-up, and its report (routing_report)."""

import random

import pytest

from loadtest.serving.routing_bench import (
    POLICIES,
    VLLM_ROUTER_POLICY,
    affinity_lru_hit_rate,
    chosen_policies,
    chosen_workloads,
    ideal_hit_rate,
    shared_prefix,
    vllm_router_argv,
)
from loadtest.serving.routing_report import markdown

B = 4  # block size


def test_ideal_hit_rate_counts_full_blocks_seen_before():
    a, b = [1] * 8 + [2, 3], [1] * 8 + [4, 5]  # two full blocks shared, a partial one not
    assert ideal_hit_rate([a, b], B) == 8 / 20
    assert ideal_hit_rate([a], B) == 0.0


def test_bound_equals_the_ideal_when_caches_hold_everything():
    prompts = shared_prefix(random.Random(0), groups=4, context=16, question=3, requests=40)
    assert affinity_lru_hit_rate(prompts, B, workers=2, capacity_blocks=1000) == ideal_hit_rate(prompts, B)


def test_a_system_prompt_starts_every_group_alike():
    """--system: one preamble before every group's context, so the prompts' first tokens
    (the proxy's affinity key) no longer tell the groups apart; the groups still differ."""
    prompts = shared_prefix(random.Random(0), groups=4, context=16, question=3, requests=40, system=12)
    assert len({tuple(p[:12]) for p in prompts}) == 1
    assert len({tuple(p[:28]) for p in prompts}) == 4
    assert all(len(p) == 12 + 16 + 3 for p in prompts)


def test_bound_falls_when_the_groups_do_not_fit():
    prompts = shared_prefix(random.Random(0), groups=8, context=16, question=3, requests=80)
    roomy = affinity_lru_hit_rate(prompts, B, workers=2, capacity_blocks=16)  # 4 groups of 4 blocks each
    tight = affinity_lru_hit_rate(prompts, B, workers=2, capacity_blocks=8)  # room for 2 of its 4
    assert roomy == ideal_hit_rate(prompts, B)
    assert 0 < tight < roomy


def test_a_prefix_follows_its_first_worker_and_new_ones_balance():
    # Prefix x twice, then y: y goes to the other worker, so a cache of one prompt's blocks
    # per worker still hits x's second request (one worker alone would have evicted it).
    x, y = [1] * 8, [2] * 8
    assert affinity_lru_hit_rate([x, y, x], B, workers=2, capacity_blocks=2) == 8 / 24
    assert affinity_lru_hit_rate([x, y, x], B, workers=1, capacity_blocks=2) == 0.0


def test_after_a_system_prompt_the_groups_are_keyed_on_their_own_first_block():
    """Keyed on the first block, which the system prompt fills, every group lands on one
    worker and its small cache churns; keyed on the first block of the group's context
    (`key_block`), the groups balance over both workers."""
    prompts = shared_prefix(random.Random(0), groups=4, context=16, question=3, requests=60, system=4)
    one_worker = affinity_lru_hit_rate(prompts, B, workers=1, capacity_blocks=10)
    by_system = affinity_lru_hit_rate(prompts, B, workers=2, capacity_blocks=10)
    by_group = affinity_lru_hit_rate(prompts, B, workers=2, capacity_blocks=10, key_block=1)
    assert by_system == one_worker < by_group


def test_hits_stop_at_the_first_missing_block():
    # The second prompt shares block 1 and 3 but not block 2: only block 1 is a hit.
    assert affinity_lru_hit_rate([[1] * 4 + [2] * 4 + [3] * 4, [1] * 4 + [9] * 4 + [3] * 4], B, 1, 100) == 4 / 24


def test_an_eagle_engine_gives_up_the_last_block_of_a_hit():
    x = [1] * 12  # three blocks
    assert affinity_lru_hit_rate([x, x], B, 1, 100) == 12 / 24
    assert affinity_lru_hit_rate([x, x], B, 1, 100, drop_last_hit_block=True) == 8 / 24


def test_the_rust_router_runs_in_pd_mode_with_cache_aware_on_both_pools():
    workers = {"prefill": ["http://p0", "http://p1"], "decode": ["http://d0", "http://d1"]}
    argv = vllm_router_argv("/bin/vllm-router", 9000, workers)
    assert argv[:1] == ["/bin/vllm-router"] and "--vllm-pd-disaggregation" in argv
    assert argv[argv.index("--policy") + 1] == "cache_aware" and argv[argv.index("--kv-connector") + 1] == "nixl"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--prefill"] == workers["prefill"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--decode"] == workers["decode"]


def test_policies_default_to_all_and_a_subset_is_checked():
    assert chosen_policies(None, None) == list(POLICIES)
    assert chosen_policies(None, "/bin/vllm-router") == [*POLICIES, VLLM_ROUTER_POLICY]
    assert chosen_policies(f"kv_aware, {VLLM_ROUTER_POLICY}", "/bin/r") == ["kv_aware", VLLM_ROUTER_POLICY]
    with pytest.raises(SystemExit, match="unknown"):
        chosen_policies("kv_awarre", None)
    with pytest.raises(SystemExit, match="needs --vllm-router"):
        chosen_policies(VLLM_ROUTER_POLICY, None)
    assert chosen_workloads("multi_turn") == ["multi_turn"]
    with pytest.raises(SystemExit):
        chosen_workloads("chat")


def test_table_has_the_bound_column():
    run = {
        "workload": "w",
        "policy": "p",
        "failed": 0,
        "requests": 1,
        "prefill_hit_rate": 0.5,
        "decode_hit_rate": 0.1,
        "ideal_hit_rate": 0.7,
        "affinity_lru_hit_rate": 0.45,
        "ttft_ms": {"median": 1, "p90": 2},
        "itl_ms": {"median": 3, "p90": 4},
        "output_tokens_per_s": 1.0,
        "local_prefills": 0,
    }
    table = markdown({"command": "c", "runs": [run]})
    assert "balanced affinity (sim.)" in table and "| 0.70 | 0.45 |" in table


def test_table_says_whether_the_decode_workers_report_their_pulled_blocks():
    events = {
        "vllm_version": "0.33.0",
        "wire_form": {"p": "tagged maps", "d": "tagged maps"},
        "malformed": 0,
        "decode_reports_received_blocks": False,
        "prompts": [{"full_blocks": 31, "decode": {"d0": 0, "d1": 31}}, {"full_blocks": 31, "decode": {"d0": 0}}],
    }
    table = markdown({"command": "c", "runs": [], "kv_events": events})
    assert "vLLM 0.33.0, tagged maps" in table and "pulled over NIXL: NO" in table and "31/31, 0/31" in table
    failed = markdown({"command": "c", "runs": [], "kv_events": {"error": "SystemExit: no replay endpoint"}})
    assert "the check failed (SystemExit: no replay endpoint)" in failed


def test_rounds_pool_into_one_row_per_workload_and_policy():
    """--repeats: latencies over every round's requests, hit rates over every round's
    prompt tokens (not a mean of rates), each round's TTFT p90 kept beside them."""
    from loadtest.serving.routing_report import pool_run, pooled_summary, summarize
    from loadtest.serving.serve_stats import RequestResult

    acc: dict = {}
    for ttfts, hits in (([0.1] * 9 + [1.0], (10, 100)), ([0.2] * 10, (90, 100))):
        results = [RequestResult(ok=True, output_tokens=2, ttft_s=t, itl_s=[0.01]) for t in ttfts]
        row = {
            **summarize(results, 2.0),
            "prefill_hit_rate": 0,
            "decode_hit_rate": 0,
            "ideal_hit_rate": 0.5,
            "affinity_lru_hit_rate": 0.25,
            "local_prefills": 1.0,
            "window_s": 2.0,
            "hits": {"prefill": hits, "decode": (0, 50)},
        }
        pool_run(acc, row, results)
    pooled = pooled_summary(acc)
    assert pooled["requests"] == 20 and pooled["failed"] == 0
    assert pooled["prefill_hit_rate"] == 100 / 200 and pooled["decode_hit_rate"] == 0
    assert pooled["ideal_hit_rate"] == 0.5 and pooled["local_prefills"] == 2.0
    assert pooled["output_tokens_per_s"] == 40 / 4.0
    assert len(pooled["ttft_p90_ms_by_round"]) == 2
    assert pooled["ttft_ms"]["median"] == 200.0  # over all 20 requests
    table = markdown({"command": "c", "runs": [{"workload": "w", "policy": "p", **pooled}]})
    assert "by round" in table and f"{pooled['ttft_p90_ms_by_round'][0]:.0f}, " in table


def test_every_policy_of_a_round_gets_the_same_groups_and_arrivals_with_fresh_ids():
    """The paired comparison: within a round the group order and the arrival gaps come
    from the round alone, the token ids from each run's seed."""
    from loadtest.serving.routing_bench import arrival_gaps, group_order

    def run(round_index: int, seed: int):
        structure = random.Random(f"round {round_index}")
        order, gaps = group_order(structure, 4, 20), arrival_gaps(structure, 2.0, 20)
        return order, gaps, shared_prefix(random.Random(seed), 4, 16, 3, 20, order=order)

    order_a, gaps_a, prompts_a = run(0, seed=1)
    order_b, gaps_b, prompts_b = run(0, seed=2)
    assert (order_a, gaps_a) == (order_b, gaps_b)
    assert not {tuple(p) for p in prompts_a} & {tuple(p) for p in prompts_b}  # no run finds another's blocks
    # The same group structure: requests i and j share a context in one run iff they do in the other.
    same_context = [[a[:16] == b[:16] for b in prompts_a] for a in prompts_a]
    assert same_context == [[a[:16] == b[:16] for b in prompts_b] for a in prompts_b]
    assert [len(set(order_a[: i + 1])) for i in range(20)][-1] > 1
    assert run(1, seed=1)[:2] != (order_a, gaps_a)  # another round, another draw


def test_ttft_breakdown_splits_ttft_into_the_proxys_phases_and_the_tail():
    from loadtest.serving.routing_report import prefill_share, ttft_breakdown
    from loadtest.serving.serve_stats import RequestResult

    fast = [
        RequestResult(
            True,
            ttft_s=0.1,
            phases_ms={"route": 1.0, "prefill": 60.0, "decode": 4.0},
            served_by={"prefill": "http://p0"},
        )
        for _ in range(9)
    ]
    slow = RequestResult(
        True, ttft_s=1.0, phases_ms={"route": 1.0, "prefill": 900.0, "decode": 4.0}, served_by={"prefill": "http://p1"}
    )
    local = RequestResult(
        True, ttft_s=0.05, phases_ms={"route": 1.0, "prefill": 0.0, "decode": 4.0}, served_by={"prefill": "local"}
    )
    breakdown = ttft_breakdown([*fast, slow])
    assert breakdown["median"] == {"route": 1.0, "prefill": 60.0, "decode": 4.0, "first_token": 35.0}
    assert breakdown["slowest_tenth"]["prefill"] == 900.0 and breakdown["slowest_tenth"]["first_token"] == 95.0
    assert prefill_share([*fast, slow, local]) == 0.9
    assert ttft_breakdown([RequestResult(True, ttft_s=0.1)]) is None and prefill_share([]) is None
    run = {
        "workload": "w",
        "policy": "p",
        "failed": 0,
        "requests": 10,
        "prefill_hit_rate": 0.5,
        "decode_hit_rate": 0.1,
        "ideal_hit_rate": 0.7,
        "affinity_lru_hit_rate": 0.45,
        "ttft_ms": {"median": 1, "p90": 2},
        "itl_ms": {"median": 3, "p90": 4},
        "output_tokens_per_s": 1.0,
        "local_prefills": 0,
        "ttft_breakdown": breakdown,
        "prefill_share": 0.9,
    }
    assert "| w | p | 1 / 1 | 60 / 900 | 4 / 4 | 35 / 95 | 0.90 |" in markdown({"command": "c", "runs": [run]})


def test_warm_up_sends_both_workloads_shapes_before_the_rounds(monkeypatch):
    import argparse
    import asyncio

    from loadtest.serving import routing_bench

    sent = []

    async def shared(url, prompts, gaps, max_tokens, bar):
        sent.append(("shared_prefix", url, [len(p) for p in prompts]))

    async def turns(url, sessions, turns, start, step, max_tokens, seed, bar):
        sent.append(("multi_turn", url, (sessions, turns, start, step)))

    monkeypatch.setattr(routing_bench, "run_shared_prefix", shared)
    monkeypatch.setattr(routing_bench, "run_multi_turn", turns)
    args = argparse.Namespace(
        system=128, context=768, question=64, sessions=4, turns=4, start=256, step=128, max_tokens=8
    )
    asyncio.run(routing_bench.warm_up(args, "http://rr"))
    assert sent == [("shared_prefix", "http://rr", [960] * 4), ("multi_turn", "http://rr", (4, 4, 256, 128))]
