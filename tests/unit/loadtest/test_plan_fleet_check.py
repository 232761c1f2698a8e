"""The planner against the fleet benchmark (loadtest/serving/plan_fleet_check.py): each level
of a fleet_report job goes through the model with the prompt tokens the fleet computed, the
goodputs are set side by side and each way's first-ranked layout named; a policy or trace
the report lacks stops it."""

import json

import pytest

from loadtest.serving import plan_fleet_check

PROFILE = "cpu-2core-pdspec-tiny-eagle3"


BLOCK_SIZE = 16
CAPACITY_BLOCKS = 100  # 1,600 tokens an engine: the fleet benchmark cuts each engine's KV


def level(qps: float, requests: int, recomputed: int, ttft_p90: float) -> dict:
    return {
        "qps": qps,
        "requests": requests,
        "duration_s": requests / qps,
        "achieved_rps": qps,
        "prompt_tokens": requests * 400,  # the whole prompts; recomputed: what the caches lacked
        "recomputed_tokens": recomputed,
        "acceptance_length": 2.0,
        "ttft_ms": {"p50": ttft_p90 / 2, "p90": ttft_p90},
        "tpot_ms": {"p50": 8.0, "p90": 9.0},
    }


def job(policy: str, sustained: float, workload: str = "sc") -> dict:
    return {
        "workload": workload,
        "policy": policy,
        "levels": [level(2, 10, 10 * 300, 120.0), level(4, 20, 20 * 100, 150.0)],
        "goodput": {"relaxed": {"sustained_rps": sustained}},
    }


def run(tmp_path, *extra: str, capacity_blocks: int | None = CAPACITY_BLOCKS) -> dict:
    report = {"summaries": [job("prefix_affinity", 3.0), job("colocated_kv_aware", 2.0), job("kv_aware", 9.0, "mt")]}
    if capacity_blocks is not None:
        report |= {"capacity_blocks": capacity_blocks, "reference": {"sc": {"block_size": BLOCK_SIZE}}}
    (tmp_path / "fleet_report.json").write_text(json.dumps(report))
    argv = ["--report", str(tmp_path / "fleet_report.json"), "--profile", PROFILE, "--k", "3", "--devices", "2"]
    argv += ["--trace", "sc", "--osl", "16", "--seeds", "1", "--out", str(tmp_path / "out"), *extra]
    return plan_fleet_check.main(argv)


def test_each_level_runs_with_the_tokens_the_fleet_computed_and_the_first_picks_are_named(tmp_path):
    report = run(tmp_path, "--layout", "2p2d=prefix_affinity", "--layout", "colocated-4=colocated_kv_aware")
    disaggregated = report["layouts"]["2p2d"]
    assert [row["isl_computed"] for row in disaggregated["levels"]] == [300, 100]
    assert [row["rate"] for row in disaggregated["levels"]] == [2.0, 4.0]
    assert all(row["acceptance"] == 2.0 for row in disaggregated["levels"])
    assert disaggregated["goodput"]["measured_rps"] == 3.0 and disaggregated["goodput"]["isl_computed"] == 200
    for row in disaggregated["levels"]:
        assert row["predicted"]["ttft_p90_ms"] > 0 and row["measured"]["ttft_p90_ms"] in (120.0, 150.0)
    assert report["first"]["measured"] == "2p2d"  # 3.0 against 2.0 req/s measured
    predicted = {name: layout["goodput"]["predicted_rps"] for name, layout in report["layouts"].items()}
    assert report["first"]["predicted"] == max(predicted, key=predicted.get)
    table = (tmp_path / "out" / "plan_fleet_check.md").read_text()
    assert "| 2p2d | prefix_affinity | 3.00 /" in table and "Ranked first: measured **2p2d**" in table
    assert json.loads((tmp_path / "out" / "plan_fleet_check.json").read_text())["first"] == report["first"]


@pytest.mark.parametrize(
    "layout, message",
    [
        ("2p2d=kv_aware", "no sc:kv_aware job"),  # kv_aware ran on another trace only
        ("colocated-1=prefix_affinity", "cannot model colocated-1 on 2 devices"),  # one engine, two devices
    ],
)
def test_a_job_or_layout_it_cannot_use_stops_it_with_the_reason(tmp_path, layout, message):
    with pytest.raises(SystemExit, match=message):
        run(tmp_path, "--layout", layout)
    assert not (tmp_path / "out").exists()


def test_sharing_sets_alpha_and_fit_sharing_fits_each_layouts_levels_below_its_goodput(tmp_path):
    layouts = ("--layout", "2p2d=prefix_affinity", "--layout", "colocated-4=colocated_kv_aware")
    overlapping = run(tmp_path, *layouts, "--sharing", "0")
    thrashing = run(tmp_path, *layouts, "--sharing", "3")
    assert thrashing["sharing"] == {"alpha": 3.0, "from": "--sharing"}

    def tpot_sum(report):
        return sum(row["predicted"]["tpot_p50_ms"] for layout in report["layouts"].values() for row in layout["levels"])

    assert tpot_sum(thrashing) > tpot_sum(overlapping)
    fitted = run(tmp_path, *layouts, "--fit-sharing", "--fit-figures", "tpot_p50_ms")
    # 2P2D measured 3 req/s of goodput, colocated 2: QPS 2 of each is below, QPS 4 of neither.
    assert fitted["sharing"]["fit"]["levels"] == 2 and fitted["sharing"]["fit"]["figures"] == ["tpot_p50_ms"]
    assert "Fitted alpha" in (tmp_path / "out" / "plan_fleet_check.md").read_text()
    with pytest.raises(SystemExit, match="alpha >= 0"):
        run(tmp_path, *layouts, "--sharing", "-1")


def test_sharing_form_demand_sets_and_fits_the_decode_demand_and_refuses_one_over_one(tmp_path):
    layouts = ("--layout", "2p2d=prefix_affinity", "--layout", "colocated-4=colocated_kv_aware")
    set_ = run(tmp_path, *layouts, "--sharing-form", "demand", "--sharing", "0.5")
    assert set_["sharing"] == {"form": "demand", "decode_demand": 0.5, "from": "--sharing"}
    assert (
        "Device sharing decode demand 0.5 (the demand form)" in (tmp_path / "out" / "plan_fleet_check.md").read_text()
    )
    fitted = run(tmp_path, *layouts, "--sharing-form", "demand", "--fit-sharing", "--fit-figures", "tpot_p50_ms")
    fit = fitted["sharing"]["fit"]
    assert fit["form"] == "demand" and [c for c, _ in fit["errors"]][-1] == 1.0
    assert fitted["sharing"]["decode_demand"] == fit["alpha"] == min(fit["errors"], key=lambda point: point[1])[0]
    with pytest.raises(SystemExit, match="decode demand of 0 to 1"):
        run(tmp_path, *layouts, "--sharing-form", "demand", "--sharing", "1.5")


def row(qps: float, ttft_p90: float, tpot_p90: float, attainment: float, requests: int = 20) -> dict:
    predicted = {"ttft_p90_ms": ttft_p90, "tpot_p90_ms": tpot_p90, "attainment": attainment}
    return {"qps": qps, "requests": requests, "duration_s": requests / qps, "predicted": predicted}


def test_goodput_as_measured_is_the_sustained_figure_of_the_models_runs_of_the_levels():
    """As fleet_report takes it: the levels in QPS order up to the first whose predicted TTFT
    p90 or TPOT p90 is outside the SLO; of the last before it, the requests meeting both over
    the level's length; a pass above a fail not counted; 0 when the first level fails."""
    slo = plan_fleet_check.Slo(ttft_p90_ms=2000.0, tpot_p90_ms=100.0)
    held = [row(2, 500, 50, 1.0), row(4, 900, 60, 0.95), row(8, 2500, 60, 0.5), row(11, 1500, 60, 1.0)]
    assert plan_fleet_check.goodput_as_measured(list(reversed(held)), slo) == pytest.approx(0.95 * 4)
    assert plan_fleet_check.goodput_as_measured([row(2, 500, 150, 0.9), row(4, 900, 60, 1.0)], slo) == 0.0
    assert plan_fleet_check.goodput_as_measured([row(2, 500, 50, 1.0)], slo) == pytest.approx(2.0)


def test_the_report_gives_each_layouts_goodput_as_measured_and_its_first_pick(tmp_path):
    report = run(tmp_path, "--layout", "2p2d=prefix_affinity", "--layout", "colocated-4=colocated_kv_aware")
    for layout in report["layouts"].values():
        assert layout["goodput"]["predicted_levels_rps"] == round(
            plan_fleet_check.goodput_as_measured(layout["levels"], plan_fleet_check.Slo(2000.0, 100.0)), 2
        )
        assert all({"attainment", "tpot_p90_ms"} <= set(level["predicted"]) for level in layout["levels"])
    assert report["first"]["predicted_levels"] == plan_fleet_check.first_of(report["layouts"], "predicted_levels_rps")
    assert "(as measured: **" in (tmp_path / "out" / "plan_fleet_check.md").read_text()


def test_a_tie_for_the_most_goodput_is_named_a_tie_not_a_pick():
    layouts = {"2p2d": {"goodput": {"x": 7.5}}, "colocated-4": {"goodput": {"x": 7.5}}, "1p3d": {"goodput": {"x": 2.0}}}
    assert plan_fleet_check.first_of(layouts, "x") == "tie: 2p2d, colocated-4"
    layouts["colocated-4"]["goodput"]["x"] = 7.6
    assert plan_fleet_check.first_of(layouts, "x") == "colocated-4"


LAYOUTS = ("--layout", "2p2d=prefix_affinity", "--layout", "colocated-4=colocated_kv_aware")


def test_each_engine_holds_the_fleets_kv_scaled_so_as_many_requests_fit_as_on_the_fleet(tmp_path):
    """--kv report (the default): the report's capacity_blocks x block size, scaled per level by
    (computed prompt + OSL) / (whole prompt + OSL); --kv profile keeps the profile's."""
    fleet = run(tmp_path, *LAYOUTS)
    tokens = CAPACITY_BLOCKS * BLOCK_SIZE
    assert fleet["kv_tokens"]["from"] == "report" and fleet["kv_tokens"]["fleet_engine"] == tokens
    # Levels of 300 and 100 computed tokens of a 400-token prompt, 16 out (run's --osl).
    assert [row["kv_tokens"] for row in fleet["layouts"]["2p2d"]["levels"]] == [
        round(tokens * (300 + 16) / (400 + 16)),
        round(tokens * (100 + 16) / (400 + 16)),
    ]
    assert "the fleet's 1,600 tokens" in (tmp_path / "out" / "plan_fleet_check.md").read_text()
    profile = run(tmp_path, *LAYOUTS, "--kv", "profile")
    whole = profile["kv_tokens"]["profile"]
    assert profile["kv_tokens"]["fleet_engine"] is None and whole > 10 * tokens
    assert {row["kv_tokens"] for layout in profile["layouts"].values() for row in layout["levels"]} == {whole}


def test_a_fleet_kv_too_small_for_the_load_queues_requests_the_profiles_kv_would_not(tmp_path):
    """A 25-block engine (400 tokens, scaled to 304 at the first level) holds one of its
    316-token requests at a time: with the fleet's KV the model's TTFT rises where the
    profile's whole-device KV lets it batch, and so does the steady-state goodput's verdict."""
    cramped = run(tmp_path, *LAYOUTS, capacity_blocks=25)
    roomy = run(tmp_path, *LAYOUTS, "--kv", "profile")

    def ttft_p90(report):
        return sum(row["predicted"]["ttft_p90_ms"] for row in report["layouts"]["2p2d"]["levels"])

    assert ttft_p90(cramped) > ttft_p90(roomy)
    # The steady-state candidate (evaluate) runs with the levels' mean scaled KV too.
    assert cramped["layouts"]["2p2d"]["goodput"]["predicted_rps"] < roomy["layouts"]["2p2d"]["goodput"]["predicted_rps"]


def test_the_sharing_fit_runs_its_trials_with_the_fleets_kv(tmp_path, monkeypatch):
    seen = []
    rows = plan_fleet_check.level_rows

    def recording(*args, **kwargs):
        out = rows(*args, **kwargs)
        seen.extend(row["kv_tokens"] for row in out)
        return out

    monkeypatch.setattr(plan_fleet_check, "level_rows", recording)
    run(tmp_path, *LAYOUTS, "--fit-sharing", "--fit-figures", "tpot_p50_ms")
    tokens = CAPACITY_BLOCKS * BLOCK_SIZE
    assert set(seen) == {round(tokens * (300 + 16) / (400 + 16)), round(tokens * (100 + 16) / (400 + 16))}


def test_a_level_without_its_prompt_tokens_stops_kv_report(tmp_path):
    report = {"summaries": [job("prefix_affinity", 3.0)], "capacity_blocks": CAPACITY_BLOCKS}
    report["reference"] = {"sc": {"block_size": BLOCK_SIZE}}
    del report["summaries"][0]["levels"][1]["prompt_tokens"]
    (tmp_path / "fleet_report.json").write_text(json.dumps(report))
    argv = ["--report", str(tmp_path / "fleet_report.json"), "--profile", PROFILE, "--k", "3", "--devices", "2"]
    argv += ["--trace", "sc", "--layout", "2p2d=prefix_affinity", "--seeds", "1", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match="at 4 QPS has no prompt_tokens"):
        plan_fleet_check.main(argv)


def test_a_report_without_its_kv_size_stops_kv_report_and_names_the_way_out(tmp_path):
    with pytest.raises(SystemExit, match="--kv profile"):
        run(tmp_path, *LAYOUTS, capacity_blocks=None)
    assert not (tmp_path / "out").exists()
    assert run(tmp_path, *LAYOUTS, "--kv", "profile", capacity_blocks=None)["kv_tokens"]["from"] == "profile"


def test_serving_from_qps_matches_each_layouts_level_there_and_shifts_its_others_by_the_term(tmp_path):
    """Each layout's term of its kind from its own level at Q: that level's modelled TTFT p50 is
    the measured (60 ms, half of ttft_p90 120), the others move by the change of the term; a
    term the model cannot match (its TTFT already above) is 0 and said so."""
    plain = run(tmp_path, *LAYOUTS)
    served = run(tmp_path, *LAYOUTS, "--serving-from-qps", "2")
    table = (tmp_path / "out" / "plan_fleet_check.md").read_text()
    assert served["serving_from_qps"] == 2.0
    for name, kind in (("2p2d", "disaggregated_ms"), ("colocated-4", "aggregated_ms")):
        serving = served["layouts"][name]["serving"]
        before = plain["layouts"][name]["levels"]
        after = served["layouts"][name]["levels"]
        assert serving["kind"] == kind and serving["from_qps"] == 2.0
        assert serving["model_ttft_p50_ms_before"] == pytest.approx(before[0]["predicted"]["ttft_p50_ms"], abs=0.05)
        assert not serving["clamped"] and f"{name}: serving term ({kind.removesuffix('_ms')})" in table
        assert after[0]["predicted"]["ttft_p50_ms"] == pytest.approx(60.0)
        # The profile's own term (the CPU profile has one) is replaced, not added to.
        shift = after[1]["predicted"]["ttft_p50_ms"] - before[1]["predicted"]["ttft_p50_ms"]
        assert shift == pytest.approx(serving["term_ms"] - serving["profile_ms"], abs=0.1)


def test_a_serving_term_the_model_cannot_match_is_zero_and_said_so(tmp_path):
    """A level measured faster (TTFT p50 1 ms) than the model gives it with no term at all: the
    term is 0, never negative, marked clamped, and the table says so."""
    fast = job("prefix_affinity", 3.0)
    fast["levels"][0] = level(2, 10, 10 * 300, 2.0)
    report = {"summaries": [fast], "capacity_blocks": CAPACITY_BLOCKS, "reference": {"sc": {"block_size": BLOCK_SIZE}}}
    (tmp_path / "fleet_report.json").write_text(json.dumps(report))
    argv = ["--report", str(tmp_path / "fleet_report.json"), "--profile", PROFILE, "--k", "3", "--devices", "2"]
    argv += ["--trace", "sc", "--osl", "16", "--seeds", "1", "--out", str(tmp_path / "out")]
    served = plan_fleet_check.main([*argv, "--layout", "2p2d=prefix_affinity", "--serving-from-qps", "2"])
    serving = served["layouts"]["2p2d"]["serving"]
    assert serving["clamped"] and serving["term_ms"] == 0.0 and serving["model_ttft_p50_ms_before"] > 1.0
    assert "so 0." in (tmp_path / "out" / "plan_fleet_check.md").read_text()


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--serving-from-qps", "3"), "prefix_affinity has no level at it"),  # levels at 2 and 4 only
        (("--serving-from-qps", "2", "--fit-sharing"), "fit the device term first"),
    ],
)
def test_a_serving_level_it_cannot_use_stops_it_with_the_reason(tmp_path, extra, message):
    with pytest.raises(SystemExit, match=message):
        run(tmp_path, *LAYOUTS, *extra)
    assert not (tmp_path / "out").exists()
