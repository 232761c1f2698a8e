"""The serving term from a hand-off probe (loadtest/engine_bench/serving_overhead.py): each
kind's term is the probe's TTFT less the fleet model's idle TTFT for the same request, so a
profile given the term matches the probe at idle; a term the curves already exceed is 0;
a probe without its figures is refused, nothing written."""

import json

import pytest

from loadtest.engine_bench import serving_overhead
from pdspec.plan import profile as profiles
from pdspec.plan.fleet_model import Layout
from tests.engine_profiles import synthetic

PROFILE = synthetic()


def probe(proxy=200.0, prefill_leg=110.0, decode_pull=80.0, local=150.0, isl=512, max_tokens=4):
    median = {
        "proxy_ttft_ms": proxy,
        "prefill_leg_ms": prefill_leg,
        "decode_pull_ttft_ms": decode_pull,
        "decode_local_ttft_ms": local,
    }
    return {"input_len": isl, "max_tokens": max_tokens, "median": median}


def test_each_kinds_term_is_the_probe_less_the_models_idle_ttft():
    term, figures = serving_overhead.serving_overhead(PROFILE, probe(), 3, "a unit test")
    pd = serving_overhead.idle_ttft_ms(PROFILE, Layout.disaggregated(1, 1), 3, 512, 4)
    aggregated = serving_overhead.idle_ttft_ms(PROFILE, Layout.aggregated(1), 3, 512, 4)
    assert term.disaggregated_ms == pytest.approx(200.0 - pd, abs=0.05)
    # The local TTFT (no proxy) plus the proxy's own share: 200 - 110 - 80 = 10 ms.
    assert figures["proxy_own_ms"] == 10.0
    assert term.aggregated_ms == pytest.approx(150.0 + 10.0 - aggregated, abs=0.05)


def test_with_the_term_the_model_gives_the_probes_ttft_at_idle():
    term, _ = serving_overhead.serving_overhead(PROFILE, probe(), 3, "a unit test")
    served = PROFILE.model_copy(update={"serving_ms": term})
    bare_ms = serving_overhead.idle_ttft_ms(PROFILE, Layout.disaggregated(1, 1), 3, 512, 4)
    from pdspec.plan.fleet_model import simulate
    from pdspec.plan.workload import Request

    (outcome,) = simulate(served, Layout.disaggregated(1, 1), 3, [Request(0.0, 512, 4)]).outcomes
    assert outcome.ttft_s * 1000 == pytest.approx(200.0, abs=0.05)
    assert bare_ms < 200.0


def test_a_probe_faster_than_the_curves_gives_no_negative_term():
    term, figures = serving_overhead.serving_overhead(PROFILE, probe(proxy=1.0, local=1.0), 3, "a unit test")
    assert figures["disaggregated_ms"] < 0 and figures["aggregated_ms"] < 0
    assert term.disaggregated_ms == 0.0 and term.aggregated_ms == 0.0


@pytest.mark.parametrize("drop", ["input_len", "proxy_ttft_ms"])
def test_a_probe_without_its_figures_is_refused(drop):
    given = probe()
    given.pop(drop, None)
    given["median"].pop(drop, None)
    with pytest.raises(ValueError, match=drop):
        serving_overhead.serving_overhead(PROFILE, given, 3, "a unit test")


def test_a_k_the_profile_lacks_is_refused():
    with pytest.raises(ValueError, match="K=2"):
        serving_overhead.serving_overhead(PROFILE, probe(), 2, "a unit test")


def test_the_command_writes_the_profile_with_the_term_and_nothing_else_changed(tmp_path):
    source, out, probe_file = tmp_path / "p.json", tmp_path / "out.json", tmp_path / "probe.json"
    source.write_text(PROFILE.dump())
    probe_file.write_text(json.dumps(probe()))
    figures = serving_overhead.main(
        ["--profile", str(source), "--probe", str(probe_file), "--k", "3", "--source", "here", "--out", str(out)]
    )
    written = profiles.load(out)
    assert written.serving_ms.disaggregated_ms == pytest.approx(figures["disaggregated_ms"])
    assert written.serving_ms.source == "here"
    assert written.model_copy(update={"serving_ms": None}) == PROFILE


def test_a_bad_probe_exits_before_writing(tmp_path):
    source, out, probe_file = tmp_path / "p.json", tmp_path / "out.json", tmp_path / "probe.json"
    source.write_text(PROFILE.dump())
    probe_file.write_text(json.dumps({"median": {}}))
    with pytest.raises(SystemExit, match="serving_overhead"):
        serving_overhead.main(
            ["--profile", str(source), "--probe", str(probe_file), "--k", "3", "--source", "x", "--out", str(out)]
        )
    assert not out.exists()
