"""The device-sharing fit (loadtest/serving/sharing_fit.py): it recovers the alpha that made
a measurement the model itself generated, scores a row only on the figures it has measured,
and refuses what it cannot fit to."""

import argparse
import math

import pytest

from loadtest.serving import sharing_fit
from pdspec.plan import workload
from pdspec.plan.fleet_model import Layout, Slo, simulate
from tests.engine_profiles import synthetic

NO_SLO = Slo(ttft_p90_ms=float("inf"), tpot_p90_ms=float("inf"))
LAYOUT = Layout.disaggregated(2, 2, devices=1)  # every engine on one device: alpha shows everywhere


def figures(alpha: float, rate: float) -> dict:
    profile = synthetic(kv_tokens=20_000).with_sharing(alpha, "a unit test")
    summary = simulate(profile, LAYOUT, 3, workload.poisson(rate, 150, [(512, 32)], seed=4)).summary(NO_SLO)
    return {"ttft_p50_ms": summary.ttft_ms.p50, "ttft_p90_ms": summary.ttft_ms.p90, "tpot_p50_ms": summary.tpot_ms.p50}


@pytest.mark.parametrize("true_alpha", [sharing_fit.GRID[6], sharing_fit.GRID[37]], ids=str)  # 0.3 and 1.85
def test_the_fit_recovers_the_alpha_a_model_generated_measurement_was_made_with(true_alpha):
    rates = (5.0, 10.0)
    measured = {rate: figures(true_alpha, rate) for rate in rates}

    def rows_at(alpha):
        return [{"measured": measured[rate], "predicted": figures(alpha, rate)} for rate in rates]

    fitted = sharing_fit.fit(rows_at)
    assert fitted.alpha == true_alpha and fitted.error == 0 and fitted.levels == 2 and not fitted.at_edge
    assert len(fitted.errors) == len(sharing_fit.GRID) and all(
        error > 0 for alpha, error in fitted.errors if alpha != true_alpha
    )


def test_the_error_is_the_mean_absolute_log_ratio_over_the_figures_measured():
    rows = [
        {
            "measured": {"ttft_p90_ms": 100.0, "tpot_p50_ms": 10.0},
            "predicted": {"ttft_p90_ms": 200.0, "tpot_p50_ms": 5.0},
        },
        {
            "measured": {"ttft_p90_ms": None, "tpot_p50_ms": 10.0},
            "predicted": {"ttft_p90_ms": 1.0, "tpot_p50_ms": 10.0},
        },
    ]
    # Twice too high and twice too low count the same; the row without a TTFT p90 gives its TPOT only.
    assert sharing_fit.log_error(rows) == pytest.approx(2 * math.log(2) / 3)
    assert sharing_fit.log_error(rows, ("tpot_p50_ms",)) == pytest.approx(math.log(2) / 2)


def test_a_best_alpha_on_the_grids_edge_is_flagged_and_ties_go_to_the_lower():
    def rows_at(alpha):  # the error falls all the way up the grid
        return [{"measured": {"tpot_p50_ms": 100.0}, "predicted": {"tpot_p50_ms": 1.0 + alpha}}]

    assert sharing_fit.fit(rows_at).at_edge
    flat = sharing_fit.fit(lambda alpha: [{"measured": {"tpot_p50_ms": 1.0}, "predicted": {"tpot_p50_ms": 2.0}}])
    assert flat.alpha == 0.0 and not flat.at_edge


def test_no_measured_figure_or_an_unknown_one_is_refused():
    with pytest.raises(ValueError, match="no measured figure"):
        sharing_fit.log_error([{"measured": {"ttft_p90_ms": None}, "predicted": {"ttft_p90_ms": 1.0}}])
    with pytest.raises(ValueError, match="figures"):
        sharing_fit.fit(lambda alpha: [], ("throughput_rps",))


def test_a_fit_reads_back_from_its_dict():
    fitted = sharing_fit.fit(
        lambda alpha: [{"measured": {"tpot_p50_ms": 2.0}, "predicted": {"tpot_p50_ms": 1.0 + alpha}}]
    )
    assert fitted.alpha == 1.0 and sharing_fit.from_dict(fitted.as_dict()) == fitted
    assert "Fitted alpha **1**" in fitted.markdown()


# The demand form: a grid over a decode step's demand c, 0 to 1.


def demand_figures(c: float, rate: float) -> dict:
    profile = synthetic(kv_tokens=20_000).with_sharing(c, "a unit test", form="demand")
    summary = simulate(profile, LAYOUT, 3, workload.poisson(rate, 150, [(512, 32)], seed=4)).summary(NO_SLO)
    return {"ttft_p50_ms": summary.ttft_ms.p50, "ttft_p90_ms": summary.ttft_ms.p90, "tpot_p50_ms": summary.tpot_ms.p50}


@pytest.mark.parametrize("true_c", [sharing_fit.DEMAND_GRID[6], sharing_fit.DEMAND_GRID[16]], ids=str)  # 0.3, 0.8
def test_the_fit_recovers_the_decode_demand_a_model_generated_measurement_was_made_with(true_c):
    rates = (5.0, 10.0)
    measured = {rate: demand_figures(true_c, rate) for rate in rates}

    def rows_at(c):
        return [{"measured": measured[rate], "predicted": demand_figures(c, rate)} for rate in rates]

    fitted = sharing_fit.fit(rows_at, form="demand")
    assert (fitted.form, fitted.value, fitted.error) == ("demand", true_c, 0)
    assert [c for c, _ in fitted.errors] == list(sharing_fit.DEMAND_GRID) and sharing_fit.DEMAND_GRID[-1] == 1.0
    assert all(error > 0 for c, error in fitted.errors if c != true_c)


def test_a_demand_fit_at_one_is_not_flagged_at_edge_and_reads_back_with_its_form():
    # 1 is the decode demand's most, not a choice of range: the error cannot fall past it.
    fitted = sharing_fit.fit(
        lambda c: [{"measured": {"tpot_p50_ms": 100.0}, "predicted": {"tpot_p50_ms": 1.0 + c}}], form="demand"
    )
    assert fitted.value == 1.0 and not fitted.at_edge
    assert sharing_fit.from_dict(fitted.as_dict()) == fitted and "Fitted decode demand **1**" in fitted.markdown()
    with pytest.raises(ValueError, match="form"):
        sharing_fit.fit(lambda c: [], form="roofline")


def test_a_checks_report_names_the_form_only_when_it_is_demand():
    assert sharing_fit.describe("alpha", 0.35, "--sharing") == {"alpha": 0.35, "from": "--sharing"}
    demanded = sharing_fit.describe("demand", 0.5, "--sharing")
    assert demanded == {"form": "demand", "decode_demand": 0.5, "from": "--sharing"}
    assert sharing_fit.label(demanded) == "decode demand 0.5 (the demand form)"


def test_the_prefill_form_is_described_labelled_fitted_on_alphas_grid_and_checked():
    described = sharing_fit.describe("prefill", 0.38, "--sharing")
    assert described == {"form": "prefill", "prefill_alpha": 0.38, "from": "--sharing"}
    assert sharing_fit.label(described) == "prefill alpha 0.38 (the prefill form)"
    # The grid's upper edge is a choice of range here, as for alpha: flagged.
    fitted = sharing_fit.fit(
        lambda a: [{"measured": {"tpot_p50_ms": 100.0}, "predicted": {"tpot_p50_ms": 1.0 + a}}], form="prefill"
    )
    assert (fitted.form, fitted.value, fitted.at_edge) == ("prefill", sharing_fit.GRID[-1], True)
    assert "Fitted prefill alpha **4**" in fitted.markdown()
    for value, refused in ((-0.1, True), (0.0, False), (7.0, False)):
        args = argparse.Namespace(sharing=value, sharing_form="prefill")
        if refused:
            with pytest.raises(SystemExit, match="is a prefill alpha >= 0"):
                sharing_fit.check_value(args)
        else:
            sharing_fit.check_value(args)
    with pytest.raises(SystemExit, match="is an alpha >= 0"):
        sharing_fit.check_value(argparse.Namespace(sharing=-0.1, sharing_form="alpha"))
