"""The device-sharing fit (loadtest/serving/sharing_fit.py): it recovers the alpha that made
a measurement the model itself generated, scores a row only on the figures it has measured,
and refuses what it cannot fit to."""

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
