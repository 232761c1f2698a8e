"""The fleet benchmark's report (loadtest/serving/fleet_report.py): a level's SLO figures
from its requests, the sustained goodput (no noisy pass above a failing level), the
worker count each policy's hit rate is held against, and the conditional goal under each SLO."""

import math

import pytest

from loadtest.serving import fleet_bench, fleet_report

PREFILL = ["http://p0"]


def _row(ttft_s, tpot_s=0.02, ok=True):
    return {"ok": ok, "ttft_s": ttft_s, "tpot_s": tpot_s, "prompt_tokens": 100, "sent_s": 0.0, "done_s": 1.0}


def _level(phase, qps):
    return {"phase": phase, "qps": qps, "workers": {"http://p0": {fleet_report.SOURCE_COMPUTE: 50.0}}}


def test_a_level_passes_an_slo_only_when_both_p90s_are_inside_it():
    rows = [_row(0.5)] * 9 + [_row(3.0)]  # the 10th request's TTFT is past 2 s: p90 just inside
    stats = fleet_report.level_stats(_level("l1", 1.0), rows, False, PREFILL, duration_s=10.0)
    assert stats["slo"]["strict"]["attainment"] == pytest.approx(0.9)
    assert stats["slo"]["strict"]["slo_rps"] == pytest.approx(0.9)
    slow = [_row(0.5, tpot_s=0.08)] * 10  # TPOT p90 80 ms: relaxed (100) passes, strict (50) fails
    stats = fleet_report.level_stats(_level("l1", 1.0), slow, False, PREFILL, duration_s=10.0)
    assert (stats["slo"]["strict"]["passes"], stats["slo"]["relaxed"]["passes"]) == (False, True)


def test_a_failed_request_counts_as_an_infinite_ttft():
    rows = [_row(0.5)] * 5 + [_row(None, ok=False)] * 5
    stats = fleet_report.level_stats(_level("l1", 1.0), rows, False, PREFILL, duration_s=10.0)
    assert stats["failed"] == 5 and math.isinf(stats["ttft_ms"]["p90"])
    assert stats["slo"]["relaxed"]["passes"] is False
    assert stats["fleet_hit_rate"] == pytest.approx(1.0 - 50.0 / 1000.0)


def test_sustained_goodput_stops_at_the_first_failing_level():
    job = {"workload": "w", "policy": "kv_aware", "levels": [_level("a", 1.0), _level("b", 2.0), _level("c", 4.0)]}
    rows = (
        [dict(_row(0.5), phase="a")] * 10
        + [dict(_row(5.0), phase="b")] * 10  # fails
        + [dict(_row(0.5), phase="c")] * 10  # a noisy pass above the failure
    )
    summary = fleet_report.job_summary(job, rows, PREFILL, durations=[10.0, 10.0, 10.0])
    goodput = summary["goodput"]["relaxed"]
    assert (goodput["qps"], goodput["sustained_qps"]) == (4.0, 1.0)
    assert goodput["sustained_rps"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("policy", "workers"),
    [
        ("kv_aware", 2),
        ("prefix_affinity", 2),
        ("kv_aware_conditional", 4),
        ("kv_aware_conditional_full80", 4),
        ("kv_aware_conditional_pending", 4),
        ("colocated_kv_aware", 4),
    ],
)
def test_policies_where_decode_workers_prefill_are_held_against_every_worker(policy, workers):
    ref = {"by_workers": {str(n): {"eagle": {"achievable": n / 10}} for n in (2, 4)}}
    assert fleet_report.achievable(ref, policy, prefill_workers=2, all_workers=4) == workers / 10


def test_every_policy_of_the_benchmark_has_a_colour_of_its_own():
    colours = [fleet_report.COLOURS[policy] for policy in fleet_bench.ALL_POLICIES]
    assert len(set(colours)) == len(colours)


def test_a_percentile_is_numpys_until_it_reaches_the_failed_requests():
    values = [1.0, 2.0, 3.0, 4.0, math.inf, math.inf]
    assert fleet_report.percentile(values, 50) == pytest.approx(3.5)
    assert math.isinf(fleet_report.percentile(values, 70))  # between 4 and inf
    assert math.isinf(fleet_report.percentile(values, 90))  # between two infinities (numpy: NaN)
    assert fleet_report.percentile([], 90) is None


def _job(levels: list[tuple[float, int, float, float]]) -> dict:
    """A summary whose levels are (qps, requests, strict SLO-met rps, relaxed SLO-met rps)."""
    return {
        "goodput": {slo: {"rps": 1.0} for slo in fleet_report.SLOS},
        "levels": [
            {"qps": qps, "requests": n, "slo": {"strict": {"slo_rps": strict}, "relaxed": {"slo_rps": relaxed}}}
            for qps, n, strict, relaxed in levels
        ],
    }


def test_the_conditional_goal_is_judged_under_each_slo_on_the_default_rule_where_the_run_has_it():
    """Per level of >= 5 requests, the conditional job's SLO-met rate against the better of
    always-disaggregated and colocated at the same QPS; the worst shortfall decides. Strict: 1.0
    against always's 2.0 at 8 QPS (50% under); relaxed: 7.0 against colocated's 7.2 (2.8%). The
    3-request level says nothing; a level only the conditional job ran is no shortfall."""
    summaries = {
        ("sc", "kv_aware_conditional_pending"): _job(
            [(1, 3, 0.0, 0.0), (4, 10, 2.0, 4.0), (8, 20, 1.0, 7.0), (11, 6, 0.5, 5.0)]
        ),
        ("sc", "kv_aware_conditional"): _job([(4, 10, 0.0, 0.0), (8, 20, 0.0, 0.0)]),  # the plain rule: not judged
        ("sc", "kv_aware"): _job([(1, 3, 1.5, 1.5), (4, 10, 2.0, 3.0), (8, 20, 2.0, 2.0)]),
        ("sc", "colocated_kv_aware"): _job([(1, 3, 1.5, 1.5), (4, 10, 2.0, 4.0), (8, 20, 0.5, 7.2)]),
    }
    goals = [g for g in fleet_report.goals(summaries, None, 2, 4, "sc") if g["goal"].startswith("conditional")]
    by_slo = {g["slo"]: g for g in goals}
    assert sorted(by_slo) == sorted(fleet_report.SLOS) and {g["policy"] for g in goals} == {
        "kv_aware_conditional_pending"
    }
    strict, relaxed = by_slo["strict"], by_slo["relaxed"]
    assert strict["met"] is False and strict["worst"] == {
        "qps": 8,
        "conditional": 1.0,
        "best_other": 2.0,
        "shortfall": 0.5,
    }
    assert relaxed["met"] is True and relaxed["worst"]["qps"] == 8
    assert relaxed["worst"]["shortfall"] == pytest.approx((7.2 - 7.0) / 7.2)
    assert "(relaxed SLO-met requests/s" in relaxed["goal"] and "(strict SLO-met requests/s" in strict["goal"]


def test_the_conditional_goal_falls_back_to_the_plain_rule_and_is_not_run_without_both_others():
    plain = _job([(4, 10, 2.0, 4.0)])
    summaries = {("sc", "kv_aware_conditional"): plain, ("sc", "kv_aware"): plain, ("sc", "colocated_kv_aware"): plain}
    goals = [g for g in fleet_report.goals(summaries, None, 2, 4, "sc") if g["goal"].startswith("conditional")]
    assert [g["policy"] for g in goals] == ["kv_aware_conditional"] * len(fleet_report.SLOS)
    assert all(g["met"] is True for g in goals)
    del summaries[("sc", "colocated_kv_aware")]
    assert not [g for g in fleet_report.goals(summaries, None, 2, 4, "sc") if g["goal"].startswith("conditional")]
