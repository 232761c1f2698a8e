"""`pdspec plan` (pdspec/plan/command.py, through pdspec/cli.py): the plan as text, the emitted
file, the plot, and bad inputs refused in one line before any simulation. Synthetic profile
files written by the test (tests/engine_profiles.py); 50 requests per trial keep it quick."""

from __future__ import annotations

import json
import os
import sys

import pytest

from pdspec import cli
from pdspec import settings as s
from pdspec.plan import routing
from tests.engine_profiles import synthetic

# Prefill-bound: 4,096-token prompts at 300 ms per 2,048 tokens, cheap decode steps.
PREFILL_BOUND = synthetic(
    prefill=[(16, 5.0), (2048, 300.0)],
    decode={0: ([(1, 20.0), (256, 60.0)], 1.0), 2: ([(1, 24.0), (256, 70.0)], 1.8)},
    kv_tokens=16 * (4096 + 64),
)
ARGS = ["--gpus", "4", "--isl", "4096", "--osl", "64", "--slo_ttft_p90_ms", "10000", "--slo_tpot_p90_ms", "30"]
ARGS += ["--requests_per_trial", "50"]


@pytest.fixture
def profile_file(tmp_path, monkeypatch):
    for name in [name for name in os.environ if name.startswith(s.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    path = tmp_path / "prefill-bound.json"
    path.write_text(PREFILL_BOUND.dump())
    return path


def pdspec(*argv) -> int:
    with pytest.raises(SystemExit) as done:
        cli.main(["plan", *map(str, argv)])
    return done.value.code


def test_the_plan_names_the_layout_replicas_k_and_the_alternatives(profile_file, tmp_path, capsys):
    out = tmp_path / "plan.toml"
    assert pdspec("--profile", profile_file, *ARGS, "--emit", "toml", "--out", out) == 0
    text = capsys.readouterr().out
    assert "Recommended: 3P:1D, K=2: 3 prefill + 1 decode engines, one GPU each" in text
    assert "predicted: " in text and "TTFT p90 " in text and "TPOT p90 " in text
    alternatives = text.split("Alternatives (next best first):\n")[1].splitlines()
    # K=0 ties on goodput (the same prefill bound) and loses on TPOT; the rest say what stops them.
    assert alternatives[0].startswith("  3P:1D, K=0: as much goodput as the best (4.5 req/s), at TPOT p90 ")
    assert all("the best sustains 4.5 req/s" in line for line in alternatives[1:5])
    # 7 layouts (aggregated, each of 3 splits with and without conditional disaggregation) x 2 K:
    # the best, 5 shown, 8 counted.
    assert "and 8 more" in text
    assert f"toml: {out}" in text and "[prefill]\nreplicas = 3" in out.read_text()
    # Under TPOT p90 30 ms the rule's local prefills on the decode worker break the SLO sooner.
    assert any(line.startswith("  3P:1D conditional, K=2: goodput ") and "TPOT p90" in line for line in alternatives)
    assert (
        "  routing: pdspec's defaults (prefix affinity, always disaggregated): the search ranked this layout "
        "without conditional disaggregation above it with the rule" in text
    )
    assert "[proxy.routing]" not in out.read_text()


def test_a_pd_plan_that_conditional_disaggregation_pays_for_names_it_and_emits_it(profile_file, tmp_path, capsys):
    # Prefill so dear (1.2 s a 2,048-token chunk) that a colocated step breaks TPOT p90 100 ms.
    dear = PREFILL_BOUND.model_copy(update={"prefill": synthetic(prefill=[(16, 5.0), (2048, 1200.0)]).prefill})
    path = tmp_path / "dear-prefill.json"
    path.write_text(dear.dump())
    out = tmp_path / "plan.toml"
    relaxed = [a if a != "30" else "100" for a in ARGS]  # TPOT p90 <= 100 ms, 4,096-token prompts
    assert pdspec("--profile", path, *relaxed, "--emit", "toml", "--out", out) == 0
    text = capsys.readouterr().out
    assert "Recommended: 3P:1D conditional, K=2: 3 prefill + 1 decode engines" in text
    # The same split always disaggregated is held to its prefill bound, below the rule's goodput.
    assert any(line.startswith("  3P:1D, K=2: goodput 1.12 against ") for line in text.splitlines())
    assert "  routing: conditional disaggregation, kv_aware on both pools: the search ranked this layout" in text
    assert "--proxy.routing.disaggregation conditional" in text and routing.EVIDENCE in text
    assert '[proxy.routing]\nprefill_policy = "kv_aware"' in out.read_text()


def test_a_workload_file_gives_the_shapes(profile_file, tmp_path, capsys):
    path = tmp_path / "w.json"
    path.write_text(json.dumps([{"arrival_s": i, "isl": 4096, "osl": 64} for i in range(5)]))
    assert pdspec("--profile", profile_file, *ARGS, "--workload", path) == 0
    assert f"workload 5 requests' shapes from {path}" in capsys.readouterr().out


def test_the_plot_is_a_png(profile_file, tmp_path, capsys):
    # matplotlib is the bench extra's, which `make install` installs with the test extras.
    png = tmp_path / "plan.png"
    assert pdspec("--profile", profile_file, *ARGS, "--plot", png) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {png}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, says",
    [
        (
            ["--profile", "no-such-profile"],
            "no-such-profile: neither a shipped profile (cpu-2core-pdspec-tiny-eagle3, h100-qwen3-8b-dflash, "
            "h100-qwen3-8b-eagle3, h200-qwen3-8b-eagle3) nor a file",
        ),
        (["--workload", "/nonexistent.json"], "/nonexistent.json: not a workload"),
        (["--emit", "k8s", "--k8s_base", "/nonexistent"], "no kustomization.yaml in /nonexistent"),
    ],
    ids=["profile", "workload", "k8s-base"],
)
def test_a_bad_input_is_one_line_before_any_simulation(profile_file, capsys, extra, says):
    assert pdspec("--profile", profile_file, *ARGS, *extra) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no plan: nothing was simulated
    assert captured.err.startswith(f"pdspec plan: {says}") and captured.err.count("\n") == 1


def test_a_plot_without_matplotlib_says_how_to_install_it(profile_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what a missing package looks like to import
    assert pdspec("--profile", profile_file, *ARGS, "--plot", tmp_path / "p.png") == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "needs matplotlib" in captured.err and "pdspec[bench]" in captured.err


def test_an_emit_the_layout_cannot_express_prints_the_plan_then_says_why(tmp_path, capsys, monkeypatch):
    for name in [name for name in os.environ if name.startswith(s.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    path = tmp_path / "balanced.json"
    path.write_text(synthetic().dump())  # cheap prefill: four colocated engines win
    argv = ["--gpus", "4", "--slo_ttft_p90_ms", "1000", "--slo_tpot_p90_ms", "40", "--requests_per_trial", "50"]
    assert pdspec("--profile", path, *argv, "--emit", "compose", "--out", tmp_path / "o.yml") == 2
    captured = capsys.readouterr()
    assert "Recommended: aggregated x4" in captured.out and "routing:" not in captured.out  # no proxy to route
    assert "compose has no colocated workers" in captured.err and not (tmp_path / "o.yml").exists()


def test_a_slo_nothing_meets_says_so_and_exits_1(profile_file, tmp_path, capsys):
    argv = [a if a != "10000" else "1" for a in ARGS]  # TTFT p90 <= 1 ms
    assert pdspec("--profile", profile_file, *argv, "--emit", "toml", "--out", tmp_path / "x.toml") == 1
    captured = capsys.readouterr()
    assert "No layout meets the SLO at any rate tried" in captured.out and "nothing to emit" in captured.err
    assert not (tmp_path / "x.toml").exists()


def test_the_usage_lists_plan(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "  plan      size a P/D fleet" in capsys.readouterr().out


def test_an_acceptance_rate_is_said_and_used(profile_file, capsys):
    # K=2 gains 1.8 tokens a step as measured; at a rate of 0.1 it gains 1.11 and K=0 wins on TPOT.
    assert pdspec("--profile", profile_file, *ARGS, "--acceptance_rate", "0.1") == 0
    text = capsys.readouterr().out
    assert "draft acceptance rate 0.1 (given)" in text
    assert "Recommended: 3P:1D, K=0" in text


def test_a_noisy_profile_is_warned_of_before_the_plan(tmp_path, capsys, monkeypatch):
    for name in [name for name in os.environ if name.startswith(s.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    noisy = synthetic(decode={0: ([(1, 20.0), (256, 60.0)], 1.0), 2: ([(1, 24.0), (256, 30.0)], 1.8)})
    path = tmp_path / "noisy.json"
    path.write_text(noisy.dump())
    assert pdspec("--profile", path, *ARGS) == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "K=2 at 256 requests (30 ms) costs less than K=0 (60 ms)" in err
