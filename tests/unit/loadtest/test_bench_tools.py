"""The two-tool comparison's arithmetic (per-round ratios, medians, the table), its
arguments, what each tool is told, and the workers' figures over a run."""

import pytest

from loadtest.micro import bench_tools
from loadtest.micro.bench_tools import FIGURES, compare, markdown
from loadtest.serving import worker_metrics


def figures(scale: float) -> dict:
    return {name: 10.0 * scale for name, _, _ in FIGURES}


def test_ratios_are_serve_bench_over_vllm_per_round_and_their_median():
    rounds = [
        {"serve_bench": figures(1.2), "vllm_bench_serve": figures(1.0)},
        {"serve_bench": figures(1.0), "vllm_bench_serve": figures(1.0)},
        {"serve_bench": figures(0.9), "vllm_bench_serve": figures(1.0)},
    ]
    summary = compare(rounds)
    row = summary["output_tokens_per_s"]
    assert [round(r, 3) for r in row["ratios"]] == [1.2, 1.0, 0.9]
    assert row["ratio_median"] == 1.0 and row["serve_bench"] == 10.0
    report = {
        "command": "c",
        "num_prompts": 8,
        "input_len": 128,
        "output_len": 16,
        "concurrency": 2,
        "rounds": rounds,
        "summary": summary,
    }
    assert "| output_tokens_per_s | 10 | 10 | 1.000 | 1.200, 1.000, 0.900 |" in markdown(report)


def test_a_zero_reference_figure_gives_no_ratio():
    zero = {name: 0.0 for name, _, _ in FIGURES}
    summary = compare([{"serve_bench": figures(1.0), "vllm_bench_serve": zero}])
    assert summary["ttft_ms_median"]["ratio_median"] is None and summary["ttft_ms_median"]["ratios"] == []


# --- the prefix-repetition dataset and the request-rate load ----------------------------------

PREFIX = ["--dataset", "prefix-repetition", "--prefix-len", "64", "--suffix-len", "16", "--num-prefixes", "4"]


def parse(*argv: str):
    return bench_tools.parse_args(["--url", "http://proxy", "--tokenizer", "/tok", "--out", "/tmp/o", *argv])


def test_prefix_repetition_resets_caches_by_default_and_needs_the_workers():
    args = parse(*PREFIX, "--num-prompts", "8", "--prefill-url", "http://p0", "--prefill-url", "http://p1")
    assert args.reset_caches and args.input_len == 80 and args.prefill_url == ["http://p0", "http://p1"]
    assert not parse(*PREFIX, "--num-prompts", "8", "--no-reset-caches").reset_caches
    assert not parse().reset_caches and parse("--reset-caches", "--decode-url", "http://d").reset_caches
    for wrong in (
        [*PREFIX, "--num-prompts", "8"],  # a reset with no worker to reset
        [*PREFIX, "--num-prompts", "6", "--no-reset-caches"],  # not a multiple of the prefixes
        ["--dataset", "prefix-repetition", "--num-prompts", "8", "--no-reset-caches"],
        ["--num-prefixes", "4"],  # random has no prefixes
        ["--request-rate", "0"],
        ["--request-rate", "inf"],
    ):
        with pytest.raises(SystemExit):
            parse(*wrong)


def test_a_request_rate_leaves_concurrency_uncapped_unless_given():
    assert parse().concurrency == 2 and parse("--request-rate", "4").concurrency is None
    assert parse("--request-rate", "4", "--concurrency", "8").concurrency == 8


def test_both_tools_get_the_same_prompts_seed_and_load():
    args = parse(*PREFIX, "--num-prompts", "8", "--request-rate", "4", "--output-len", "48", "--no-reset-caches")
    vllm = bench_tools.tool_argv(bench_tools.VLLM, args, bench_tools.Path("/o"), 7)
    ours = bench_tools.tool_argv("serve_bench_vllm_prompts", args, bench_tools.Path("/o"), 7)

    def flag(argv: list[str], name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag(vllm, "--dataset-name") == "prefix_repetition" and flag(ours, "--dataset") == "vllm-prefix-repetition"
    for theirs, mine in (("prefix-len", "prefix-len"), ("suffix-len", "suffix-len"), ("num-prefixes", "num-prefixes")):
        assert flag(vllm, f"--prefix-repetition-{theirs}") == flag(ours, f"--{mine}")
    assert flag(vllm, "--prefix-repetition-output-len") == flag(ours, "--output-len") == "48"
    assert flag(vllm, "--seed") == flag(ours, "--seed") == "7"
    assert flag(vllm, "--request-rate") == flag(ours, "--request-rate") == "4.0"
    assert "--max-concurrency" not in vllm and "--concurrency" not in ours
    assert "--ignore-eos" in vllm and flag(vllm, "--metric-percentiles") == "50,90,99"
    assert flag(vllm, "--model") == flag(ours, "--model") == "pdspec-tiny"
    assert bench_tools.DATASET_TOOLS["prefix-repetition"] == (bench_tools.VLLM, "serve_bench_vllm_prompts")
    closed = parse()
    assert bench_tools.load_argv(closed, bench_tools.VLLM) == ["--max-concurrency", "2", "--request-rate", "inf"]
    assert bench_tools.load_argv(closed, "serve_bench") == ["--concurrency", "2"]


def counters(hits: float, queries: float, drafts: float = 0.0, accepted: float = 0.0) -> dict[str, float]:
    return {
        worker_metrics.PREFIX_HITS: hits,
        worker_metrics.PREFIX_QUERIES: queries,
        worker_metrics.DRAFTS: drafts,
        worker_metrics.ACCEPTED: accepted,
    }


def test_the_hit_rate_is_the_pools_hit_tokens_over_its_queried_tokens():
    """Summed over the prefill workers, not a mean of theirs: one worker 0 of 100, the other
    300 of 300 is 0.75 (their mean would say 0.5)."""
    before = [counters(1000, 5000), counters(0, 0)]
    after = [counters(1000, 5100), counters(300, 300)]
    prefill = bench_tools.pool_delta(before, after)
    decode = bench_tools.pool_delta([counters(0, 0, 10, 5)], [counters(0, 0, 30, 25)])
    assert bench_tools.worker_run_figures(prefill, decode) == {
        "prefill_prefix_cache_hit_rate": 0.75,
        "decode_acceptance_length": 2.0,
    }
    # Nothing read, or nothing looked up: no figure rather than 0.
    idle = bench_tools.pool_delta(before, before)
    assert bench_tools.worker_run_figures(None, None) == {} == bench_tools.worker_run_figures(idle, idle)


def prefix_report(refused: list[str], hit_rates: tuple[float, float] = (0.4, 0.4)) -> dict:
    rounds = []
    for index, rate in enumerate(hit_rates):
        ours, theirs = figures(1.0), figures(1.0)
        ours["prefill_prefix_cache_hit_rate"], theirs["prefill_prefix_cache_hit_rate"] = rate, 0.4
        reset = {"reset_s": 0.1, "refused": refused, "index_cleared": None if refused else True}
        rounds.append(
            {
                "round": index,
                "serve_bench_vllm_prompts": ours,
                "vllm_bench_serve": theirs,
                "resets": {"vllm_bench_serve": reset, "serve_bench_vllm_prompts": reset},
            }
        )
    report = {
        "command": "c",
        "dataset": "prefix-repetition",
        "num_prompts": 192,
        "num_prefixes": 96,
        "prefix_len": 4096,
        "suffix_len": 256,
        "input_len": 4352,
        "output_len": 48,
        "concurrency": None,
        "request_rate": 4.0,
        "reset_caches": True,
        "rounds": rounds,
    }
    bench_tools.summarize(report)
    return report


def test_the_prefix_report_compares_the_hit_rate_and_says_how_caches_were_reset():
    report = prefix_report([], hit_rates=(0.4, 0.44))
    assert "summary" not in report  # serve_bench's own prompts did not run
    row = report["summary_vllm_prompts"]["prefill_prefix_cache_hit_rate"]
    assert [round(r, 3) for r in row["ratios"]] == [1.0, 1.1]
    text = bench_tools.markdown(report)
    assert "| prefill_prefix_cache_hit_rate | 0.42 | 0.4 | 1.050 | 1.000, 1.100 |" in text
    assert "| ttft_ms_p90 |" in text
    assert "192 prompts over 96 shared prefixes of 4096 tokens (2 each" in text
    assert "Poisson arrivals at 4/s," in text
    assert "prefix cache reset before every run (the proxy's KV index cleared before 4 of 4 runs)" in text


def test_a_refused_reset_is_named_in_the_report():
    refusal = "http://p0: 404: not served (the worker needs VLLM_SERVER_DEV_MODE=1)"
    report = prefix_report([refusal])
    assert report["resets_refused"] == [refusal]
    assert f"Prefix-cache reset UNAVAILABLE (runs went on from warm caches): {refusal}" in bench_tools.markdown(report)
