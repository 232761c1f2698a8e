"""The projection tool (loadtest/serving/plan_projection.py): workloads by name, a row per
workload and size with the best candidate and the best disaggregated one, and the files it
writes; a synthetic profile and small fleets keep it quick."""

import json

import pytest

from loadtest.serving import plan_projection
from tests.engine_profiles import synthetic


def test_workloads_are_name_isl_osl():
    assert plan_projection.workload_of("chat:1000:300") == ("chat", 1000, 300)
    for bad in ("chat:1000", "chat:0:300", ":10:10"):
        with pytest.raises(ValueError):
            plan_projection.workload_of(bad)


def test_each_workload_and_size_gets_its_best_and_its_best_disaggregated(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(synthetic(kv_tokens=200_000).dump())
    argv = ["--profile", str(path), "--gpus", "4", "2", "--workload", "a:512:32", "--workload", "b:2048:16"]
    argv += ["--slo-ttft-p90-ms", "5000", "--slo-tpot-p90-ms", "200", "--requests-per-trial", "20"]
    report = plan_projection.main(argv + ["--out", str(tmp_path / "out")])
    assert [(r["workload"], r["gpus"]) for r in report["rows"]] == [("a", 2), ("a", 4), ("b", 2), ("b", 4)]
    for row in report["rows"]:
        assert row["best"]["goodput_rps"] >= row["best_disaggregated"]["goodput_rps"] > 0
        assert row["best"]["goodput_per_gpu"] == pytest.approx(row["best"]["goodput_rps"] / row["gpus"], abs=0.01)
    assert json.loads((tmp_path / "out" / "projection.json").read_text())["rows"] == report["rows"]
    assert "A projection, not a measurement" in (tmp_path / "out" / "projection.md").read_text()
    assert (tmp_path / "out" / "projection.png").read_bytes()[:4] == b"\x89PNG"


def test_an_unknown_profile_stops_it_before_any_simulation(tmp_path):
    with pytest.raises(SystemExit, match="plan_projection"):
        plan_projection.main(
            ["--profile", "no-such", "--gpus", "2", "--workload", "a:1:1", "--slo-ttft-p90-ms", "1"]
            + ["--slo-tpot-p90-ms", "1", "--out", str(tmp_path / "o")]
        )
    assert not (tmp_path / "o").exists()
