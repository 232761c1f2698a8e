"""The planner's validation tool (loadtest/serving/plan_check.py): layouts by name and on
how many devices, the measured acceptance put into the model, and a table of measured /
predicted per phase from a serve_bench result of the shape it writes."""

import json

import pytest

from loadtest.serving import plan_check
from pdspec.plan import profile


def test_layouts_by_name():
    assert str(plan_check.layout_of("1p1d")) == str(plan_check.Layout.disaggregated(1, 1))
    assert plan_check.layout_of("2P1D").engines == 3
    assert plan_check.layout_of("colocated-4").is_aggregated
    assert plan_check.layout_of("2p2d", devices=1) == plan_check.Layout.disaggregated(2, 2, devices=1)
    assert plan_check.layout_of("colocated-4", devices=2).devices == 2
    # '+conditional': the split routed by conditional disaggregation with the proxy's defaults.
    assert plan_check.layout_of("3p1d+conditional") == plan_check.Layout.disaggregated(
        3, 1, conditional=plan_check.Conditional()
    )
    assert plan_check.layout_of("2p2d+conditional-no-pending").conditional.counts_pending is False
    for spec, says in (("2p2d+always", "the rules a layout takes are"), ("colocated-4+conditional", "no routing rule")):
        with pytest.raises(ValueError, match=says):
            plan_check.layout_of(spec)


@pytest.mark.parametrize("devices", ["0", "5"])
def test_devices_outside_one_to_the_engines_are_refused_before_any_run(tmp_path, devices):
    with pytest.raises(SystemExit, match="on devices .*4 engines go on 1 to 4 devices"):
        plan_check.main(
            ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "2p2d", "--k", "3", "--devices", devices]
            + ["--results", str(tmp_path / "never-read.json"), "--out", str(tmp_path / "out")]
        )
    assert not (tmp_path / "out").exists()


def test_the_measured_acceptance_replaces_the_profiles_for_that_k_only():
    shipped = profile.load(profile.shipped()["cpu-2core-pdspec-tiny-eagle3"])
    changed = plan_check.with_acceptance(shipped, 3, 1.5)
    assert changed.decode[3].tokens_per_step == 1.5 and changed.decode[1] == shipped.decode[1]
    assert plan_check.with_acceptance(shipped, 3, 0.2).decode[3].tokens_per_step == 1.0  # never below one


PHASE = {
    "request_rate": 2.0,
    "completed": 20,
    "request_throughput": 1.8,
    "ttft_ms": {"median": 100.0, "p90": 150.0, "p99": 200.0},
    "tpot_ms": {"median": 7.0},
    "decode_acceptance_length": 2.0,
}


def _results(tmp_path, phases, isl=128, osl=16):
    results = tmp_path / "run" / "serve_bench.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"input_len": isl, "output_len": osl, "phases": phases}))
    return results


def test_each_poisson_phase_gets_a_prediction_beside_its_measurement(tmp_path):
    results = _results(tmp_path, [PHASE, {**PHASE, "request_rate": None}])
    report = plan_check.main(
        ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3"]
        + ["--results", str(results), "--seeds", "2", "--out", str(tmp_path / "out")]
    )
    (row,) = report["phases"]  # the closed-loop phase has no rate to model
    assert row["tokens_per_step"] == 2.0 and row["predicted"]["ttft_p50_ms"] > 0
    assert (report["engines"], report["devices"]) == (2, 2)  # one device per engine unless told
    table = (tmp_path / "out" / "plan_check.md").read_text()
    assert table.startswith("# The fleet model against 1p1d measured (")
    assert "| run | 2 | 2.00 | 1.8 / " in table
    assert row["measured"]["ttft_p90_ms"] == 150.0 and row["predicted"]["ttft_p90_ms"] > 0
    assert (tmp_path / "out" / "plan_check.png").stat().st_size > 10_000  # measured against predicted, plotted


def test_results_from_before_serve_bench_kept_a_p90_show_none_measured(tmp_path):
    old = {**PHASE, "ttft_ms": {"median": 100.0, "p99": 200.0}}
    report = plan_check.main(
        ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3"]
        + ["--results", str(_results(tmp_path, [old])), "--seeds", "1", "--out", str(tmp_path / "out")]
    )
    assert report["phases"][0]["measured"]["ttft_p90_ms"] is None
    assert "| 100.0 / " in (tmp_path / "out" / "plan_check.md").read_text()


def test_devices_put_the_engines_on_fewer_devices_which_costs_latency(tmp_path):
    loaded = {**PHASE, "request_rate": 20.0, "completed": 200}
    results = _results(tmp_path, [loaded], isl=512, osl=64)

    def check(devices):
        out = tmp_path / f"on-{devices}"
        argv = ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "2p2d", "--k", "3", "--seeds", "2"]
        argv += ["--results", str(results), "--out", str(out)] + (["--devices", str(devices)] if devices else [])
        return plan_check.main(argv)

    own, two, one = check(None), check(2), check(1)
    assert (own["devices"], two["devices"], one["devices"]) == (4, 2, 1)
    ttft = [report["phases"][0]["predicted"]["ttft_p50_ms"] for report in (own, two, one)]
    assert ttft == sorted(ttft) and ttft[2] > ttft[0]
    assert "against 2p2d on 2 devices measured" in (tmp_path / "on-2" / "plan_check.md").read_text()


def test_results_without_poisson_phases_are_refused(tmp_path):
    results = tmp_path / "serve_bench.json"
    results.write_text(json.dumps({"input_len": 1, "output_len": 1, "phases": [{"request_rate": None}]}))
    with pytest.raises(SystemExit, match="no phase with Poisson arrivals"):
        plan_check.main(
            ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3"]
            + ["--results", str(results), "--out", str(tmp_path / "out")]
        )


def test_goodput_under_an_slo_is_set_beside_the_measured_phases_best(tmp_path):
    slos = {"slos_ms": {"ttft": 1000.0, "tpot": 100.0}}
    results = _results(tmp_path, [{**PHASE, **slos, "goodput": 1.5}, {**PHASE, **slos, "goodput": 1.7}])
    argv = ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3", "--seeds", "1"]
    report = plan_check.main(
        argv + ["--goodput-slo", "1000", "100", "--results", str(results), "--out", str(tmp_path / "o")]
    )
    assert report["goodput"]["measured_rps"] == 1.7 and report["goodput"]["predicted_rps"] > 0
    assert "measured 1.7 req/s" in (tmp_path / "o" / "plan_check.md").read_text()
    with pytest.raises(SystemExit, match="measured under"):
        plan_check.main(argv + ["--goodput-slo", "500", "100", "--results", str(results), "--out", str(tmp_path / "p")])


def test_a_sweep_whose_top_rate_still_met_the_slo_gives_a_lower_bound_not_the_goodput(tmp_path):
    """The highest rate's p90s inside the SLO: the sweep never reached what the SLO bounds,
    so the measured goodput is marked a lower bound; one p90 outside it at the top: not."""
    argv = ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3", "--seeds", "1"]
    argv += ["--goodput-slo", "1000", "100"]
    slos = {"slos_ms": {"ttft": 1000.0, "tpot": 100.0}, "goodput": 1.5}
    low = {**PHASE, **slos, "tpot_ms": {"median": 7.0, "p90": 9.0}}
    cases = {
        "held": ({"ttft_ms": {"median": 500.0, "p90": 900.0, "p99": 950.0}}, True),
        "ttft": ({"ttft_ms": {"median": 500.0, "p90": 1100.0, "p99": 1200.0}}, False),
        "tpot": ({"tpot_ms": {"median": 70.0, "p90": 120.0}}, False),
    }
    for name, (top, bound) in cases.items():
        results = _results(tmp_path / name, [low, {**low, **top, "request_rate": 8.0}])
        report = plan_check.main(argv + ["--results", str(results), "--out", str(tmp_path / name / "o")])
        assert report["goodput"]["measured_is_lower_bound"] is bound, name
        assert ("a lower bound" in (tmp_path / name / "o" / "plan_check.md").read_text()) is bound, name


def test_sharing_sets_the_device_terms_alpha_and_fit_sharing_fits_it_below_the_measured_goodput(tmp_path):
    slos = {"slos_ms": {"ttft": 1000.0, "tpot": 100.0}}
    light = {**PHASE, **slos, "goodput": 3.0}  # at 2 req/s: below the measured goodput, fitted to
    heavy = {**PHASE, **slos, "request_rate": 20.0, "goodput": 2.5}  # above it: left out of the fit
    results = _results(tmp_path, [light, heavy], isl=512, osl=16)
    argv = ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "2p2d", "--devices", "1", "--k", "3"]
    argv += ["--seeds", "1", "--results", str(results)]

    def ttft_p50(report):
        return report["phases"][1]["predicted"]["ttft_p50_ms"]

    overlapping = plan_check.main(argv + ["--sharing", "0", "--out", str(tmp_path / "a0")])
    thrashing = plan_check.main(argv + ["--sharing", "2", "--out", str(tmp_path / "a2")])
    assert thrashing["sharing"] == {"alpha": 2.0, "from": "--sharing"} and ttft_p50(thrashing) > ttft_p50(overlapping)
    assert "Device sharing alpha 2 (--sharing)" in (tmp_path / "a2" / "plan_check.md").read_text()
    fitted = plan_check.main(argv + ["--goodput-slo", "1000", "100", "--fit-sharing", "--out", str(tmp_path / "fit")])
    fit = fitted["sharing"]["fit"]
    assert fit["levels"] == 1 and fit["below_goodput_rps"] == 3.0 and fit["figures"] == ["ttft_p90_ms", "tpot_p50_ms"]
    assert fitted["sharing"]["alpha"] == fit["alpha"] == min(fit["errors"], key=lambda point: point[1])[0]
    assert "Fitted alpha" in (tmp_path / "fit" / "plan_check.md").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--fit-sharing"], "--goodput-slo"), (["--sharing", "-0.5"], "alpha >= 0")],
    ids=["fit-without-goodput", "negative-alpha"],
)
def test_a_sharing_flag_it_cannot_use_stops_it_with_the_reason(tmp_path, extra, message):
    argv = ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "2p2d", "--devices", "1", "--k", "3"]
    with pytest.raises(SystemExit, match=message):
        plan_check.main(argv + ["--results", str(_results(tmp_path, [PHASE])), "--out", str(tmp_path / "o"), *extra])


def test_serving_from_rate_makes_that_phases_ttft_p50_the_measured_and_checks_the_others(tmp_path):
    """The serving term taken under load: the calibration phase's modelled TTFT p50 equals its
    measured one (the profile's term plus the difference), only the layout's kind of term
    moves, the other phases are predicted with it (later by the same shift at low load), and
    a rate no phase ran at is refused with the rates there are."""
    slow = {**PHASE, "request_rate": 1.0, "completed": 10, "ttft_ms": {"median": 900.0, "p90": 950.0, "p99": 990.0}}
    results = _results(tmp_path, [slow, {**slow, "request_rate": 2.0}])
    argv = ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3", "--seeds", "2"]
    argv += ["--results", str(results)]
    plain = plan_check.main(argv + ["--out", str(tmp_path / "plain")])
    taken = plan_check.main(argv + ["--serving-from-rate", "1", "--out", str(tmp_path / "taken")])
    shipped = profile.load(profile.shipped()["cpu-2core-pdspec-tiny-eagle3"]).serving_ms
    serving = taken["serving"]
    assert serving["kind"] == "disaggregated_ms" and serving["profile_ms"] == round(shipped.disaggregated_ms, 1)
    calibration, other = taken["phases"]
    assert calibration["predicted"]["ttft_p50_ms"] == pytest.approx(900.0, abs=1.0)
    shift = serving["term_ms"] - serving["profile_ms"]
    assert shift > 0 and plain["serving"] is None
    assert other["predicted"]["ttft_p50_ms"] == pytest.approx(
        plain["phases"][1]["predicted"]["ttft_p50_ms"] + shift, abs=5.0
    )
    table = (tmp_path / "taken" / "plan_check.md").read_text()
    assert (
        "| run | 1 (the serving term's) |" in table and "Serving term (disaggregated) taken from the 1 req/s" in table
    )
    with pytest.raises(SystemExit, match=r"no phase ran at that rate \(the results have \[1.0, 2.0\]\)"):
        plan_check.main(argv + ["--serving-from-rate", "3", "--out", str(tmp_path / "none")])


def test_goodput_is_also_predicted_as_measured_the_best_of_the_models_runs_of_the_same_phases(tmp_path):
    """Beside the planner's steady-state goodput, the measured figure's own: each phase's
    modelled requests meeting the SLO one by one over the run's length, the best phase. Under
    an SLO no request can miss it is that phase's throughput; under one every request misses,
    0."""
    argv = ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3", "--seeds", "2"]

    def check(slo_ms, name):
        slos = {"slos_ms": {"ttft": slo_ms[0], "tpot": slo_ms[1]}, "goodput": 1.5}
        results = _results(
            tmp_path / name, [{**PHASE, **slos}, {**PHASE, **slos, "request_rate": 4.0, "completed": 40}]
        )
        argv_slo = ["--goodput-slo", str(slo_ms[0]), str(slo_ms[1]), "--results", str(results)]
        return plan_check.main(argv + argv_slo + ["--out", str(tmp_path / name / "o")])

    loose = check((1e9, 1e9), "loose")
    rows = loose["phases"]
    assert loose["goodput"]["predicted_phases_rps"] == round(max(row["predicted"]["throughput_rps"] for row in rows), 2)
    assert all(row["predicted"]["goodput_rps"] == row["predicted"]["throughput_rps"] for row in rows)
    assert "by the same phases, as measured:" in (tmp_path / "loose" / "o" / "plan_check.md").read_text()
    assert check((0.001, 0.001), "tight")["goodput"]["predicted_phases_rps"] == 0.0


def test_serving_from_rate_with_fit_sharing_is_refused_before_any_run(tmp_path):
    argv = ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3", "--goodput-slo", "1000", "100"]
    argv += ["--fit-sharing", "--serving-from-rate", "1", "--results", str(tmp_path / "never-read.json")]
    with pytest.raises(SystemExit, match="--serving-from-rate and --fit-sharing"):
        plan_check.main(argv + ["--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_serving_term_that_cannot_match_its_phase_is_0_and_said_so(tmp_path):
    """A phase measured faster than the model's curves alone: the term is kept at 0 and the
    report says the phase does not match, not that it does by construction."""
    fast = {**PHASE, "request_rate": 1.0, "completed": 10, "ttft_ms": {"median": 1.0, "p90": 2.0, "p99": 3.0}}
    argv = ["--profile", "cpu-2core-pdspec-tiny-eagle3", "--layout", "1p1d", "--k", "3", "--seeds", "1"]
    report = plan_check.main(
        argv + ["--serving-from-rate", "1", "--results", str(_results(tmp_path, [fast])), "--out", str(tmp_path / "o")]
    )
    assert report["serving"]["term_ms"] == 0.0 and report["serving"]["clamped"]
    assert "does not match" in (tmp_path / "o" / "plan_check.md").read_text()
