"""The search (pdspec/plan/search.py): every layout of G engines and every K is tried; the
split follows the bottleneck (more decode engines when decode is expensive, more prefill
engines when prefill is), a K with more tokens per step at the same cost wins, and each loser
says why. Synthetic profiles only (tests/engine_profiles.py); 100 requests per trial keep
each plan well under a second here."""

import pytest

from pdspec.plan import profile, search
from pdspec.plan.fleet_model import Conditional, Layout, Slo
from tests.engine_profiles import synthetic

TRIAL = 100


def best_split(plan):
    return next(candidate for candidate in plan.ranked if not candidate.layout.is_aggregated)


def test_the_candidates_are_aggregated_and_every_split_with_and_without_conditional_disaggregation():
    rule = Conditional()
    assert search.layouts(4) == [
        Layout.aggregated(4),
        Layout.disaggregated(1, 3),
        Layout.disaggregated(1, 3, conditional=rule),
        Layout.disaggregated(2, 2),
        Layout.disaggregated(2, 2, conditional=rule),
        Layout.disaggregated(3, 1),
        Layout.disaggregated(3, 1, conditional=rule),
    ]
    assert search.layouts(1) == [Layout.aggregated(1)]
    profile = synthetic()
    plan = search.plan(profile, 3, [(1024, 64)], Slo(1000, 40), requests_per_trial=TRIAL)
    assert sorted((str(c.layout), c.k) for c in plan.ranked) == sorted(
        (str(layout), k) for layout in search.layouts(3) for k in (0, 3)
    )
    goodputs = [c.goodput_rps for c in plan.ranked]
    assert goodputs == sorted(goodputs, reverse=True) and plan.best is plan.ranked[0]


def test_expensive_decode_steps_take_more_decode_than_prefill_engines():
    # Cheap prefill (2,048 tokens in 30 ms), decode steps of 100-400 ms.
    profile = synthetic(prefill=[(16, 5.0), (2048, 30.0)], decode={0: ([(1, 100.0), (256, 400.0)], 1.0)})
    plan = search.plan(profile, 6, [(1024, 256)], Slo(3000, 500), requests_per_trial=TRIAL)
    split = best_split(plan).layout
    assert split.decode > split.prefill, split


def test_expensive_prefill_takes_more_prefill_than_decode_engines():
    # 4,096-token prompts at 300 ms per 2,048 tokens, 64 output tokens in cheap decode steps.
    profile = synthetic(
        prefill=[(16, 5.0), (2048, 300.0)], decode={0: ([(1, 20.0), (256, 60.0)], 1.0)}, kv_tokens=16 * (4096 + 64)
    )
    plan = search.plan(profile, 6, [(4096, 64)], Slo(10_000, 30), requests_per_trial=TRIAL)
    assert plan.best.layout.prefill > plan.best.layout.decode, plan.best.layout
    # The colocated engines lose on TPOT: a 300 ms prompt chunk lands in their decode steps.
    aggregated = next(c for c in plan.ranked if c.layout.is_aggregated)
    assert "TPOT p90" in aggregated.limit


def test_more_tokens_per_step_at_the_same_step_cost_wins():
    same_cost = [(1, 14.0), (256, 60.0)]
    profile = synthetic(decode={1: (same_cost, 1.2), 2: (same_cost, 2.0)})
    # A TPOT SLO that caps the batch: K=2 gets there in fewer steps, so a larger batch fits it.
    plan = search.plan(profile, 2, [(1024, 256)], Slo(1000, 20), requests_per_trial=TRIAL)
    assert plan.best.k == 2
    for layout in search.layouts(2):
        by_k = {c.k: c for c in plan.ranked if c.layout == layout}
        assert by_k[2].rate_rps > 1.5 * by_k[1].rate_rps, layout
        assert "TPOT p90" in by_k[1].limit


def test_each_loser_says_which_threshold_it_breaks_and_what_the_best_sustains():
    plan = search.plan(synthetic(), 2, [(1024, 256)], Slo(300, 20), requests_per_trial=TRIAL)
    best = plan.best
    assert best.summary is not None and best.summary.meets(Slo(300, 20)) and best.rate_rps > 0
    for loser in plan.ranked[1:]:
        why = plan.why_loses(loser)
        assert why.endswith(f"the best sustains {best.rate_rps:.3g} req/s"), why
        assert "over the 300 ms SLO from" in why or "over the 20 ms SLO from" in why or "throughput bound" in why


def test_a_slo_nothing_meets_ranks_everything_at_zero_and_says_so():
    plan = search.plan(synthetic(), 2, [(1024, 64)], Slo(1, 30), requests_per_trial=TRIAL)
    assert all(c.goodput_rps == 0 and c.summary is None for c in plan.ranked)
    assert "TTFT p90" in plan.best.limit and "over the 1 ms SLO even at" in plan.best.limit


def test_the_same_arguments_give_the_same_plan():
    def run():
        return search.plan(synthetic(), 3, [(512, 128), (2048, 32)], Slo(800, 30), requests_per_trial=TRIAL, seed=5)

    assert run() == run()


def test_the_rate_found_is_bounded_by_what_the_engines_can_do():
    profile = synthetic()
    plan = search.plan(profile, 2, [(1024, 256)], Slo(100_000, 1000), requests_per_trial=TRIAL)
    for c in plan.ranked:  # an SLO nothing breaks: every candidate stops at 90% of its bound
        bound = search.throughput_bound(profile, c.layout, c.k, [(1024, 256)], 256)
        assert c.rate_rps == pytest.approx(search.MAX_UTILIZATION * bound) and search.MAX_UTILIZATION < 1
        assert "throughput bound" in c.limit


def test_a_plan_needs_gpus_a_shape_and_requests():
    with pytest.raises(ValueError):
        search.layouts(0)
    with pytest.raises(ValueError):
        search.plan(synthetic(), 2, [], Slo(1, 1))
    with pytest.raises(ValueError):
        search.plan(synthetic(), 2, [(1, 1)], Slo(1, 1), requests_per_trial=0)


def test_conditional_disaggregation_is_named_only_where_it_adds_goodput():
    # The shipped H200 profile on 16 GPUs of chat (the projection's case): every layout with
    # the rule is held to the colocated bound, as the aggregated layout is, and met the SLO
    # there; by latency alone 3P:13D with the rule ranked first. At the same goodput and rate
    # the layout without the rule ranks first, and each tied one with it says why it loses.
    h200 = profile.load(profile.shipped()["h200-qwen3-8b-eagle3"]).with_acceptance(0.67)
    h200 = h200.model_copy(update={"decode": {1: h200.decode[1]}})
    plan = search.plan(h200, 16, [(1000, 300)], Slo(2000, 50), requests_per_trial=50)
    assert plan.best.layout == Layout.aggregated(16)
    tied = [c for c in plan.ranked[1:] if c.goodput_rps == plan.best.goodput_rps and c.rate_rps == plan.best.rate_rps]
    assert tied and all(c.layout.conditional is not None for c in tied)
    assert all(
        plan.why_loses(c).endswith("conditional disaggregation adds none, so the layout without it ranks first")
        for c in tied
    )
