"""The two-tool comparison's arithmetic: per-round ratios, medians, the table."""

from loadtest.micro.bench_tools import FIGURES, compare, markdown


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
