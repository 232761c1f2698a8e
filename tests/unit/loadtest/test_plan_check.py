"""The planner's validation tool (loadtest/serving/plan_check.py): layouts by name, the
measured acceptance put into the model, and a table of measured / predicted per phase from
a serve_bench result of the shape it writes."""

import json

import pytest

from loadtest.serving import plan_check
from pdspec.plan import profile


def test_layouts_by_name():
    assert str(plan_check.layout_of("1p1d")) == str(plan_check.Layout.disaggregated(1, 1))
    assert plan_check.layout_of("2P1D").engines == 3
    assert plan_check.layout_of("colocated-4").is_aggregated


def test_the_measured_acceptance_replaces_the_profiles_for_that_k_only():
    shipped = profile.load(profile.shipped()["cpu-2core-pdspec-tiny-eagle3"])
    changed = plan_check.with_acceptance(shipped, 3, 1.5)
    assert changed.decode[3].tokens_per_step == 1.5 and changed.decode[1] == shipped.decode[1]
    assert plan_check.with_acceptance(shipped, 3, 0.2).decode[3].tokens_per_step == 1.0  # never below one


def test_each_poisson_phase_gets_a_prediction_beside_its_measurement(tmp_path):
    phase = {
        "request_rate": 2.0,
        "completed": 20,
        "request_throughput": 1.8,
        "ttft_ms": {"median": 100.0, "p99": 200.0},
        "tpot_ms": {"median": 7.0},
        "decode_acceptance_length": 2.0,
    }
    results = tmp_path / "run" / "serve_bench.json"
    results.parent.mkdir()
    closed_loop = {**phase, "request_rate": None}
    results.write_text(json.dumps({"input_len": 128, "output_len": 16, "phases": [phase, closed_loop]}))
    report = plan_check.main(
        ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3"]
        + ["--results", str(results), "--seeds", "2", "--out", str(tmp_path / "out")]
    )
    (row,) = report["phases"]  # the closed-loop phase has no rate to model
    assert row["tokens_per_step"] == 2.0 and row["predicted"]["ttft_p50_ms"] > 0
    table = (tmp_path / "out" / "plan_check.md").read_text()
    assert "| run | 2 | 2.00 | 1.8 / " in table


def test_results_without_poisson_phases_are_refused(tmp_path):
    results = tmp_path / "serve_bench.json"
    results.write_text(json.dumps({"input_len": 1, "output_len": 1, "phases": [{"request_rate": None}]}))
    with pytest.raises(SystemExit, match="no phase with Poisson arrivals"):
        plan_check.main(
            ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3"]
            + ["--results", str(results), "--out", str(tmp_path / "out")]
        )
