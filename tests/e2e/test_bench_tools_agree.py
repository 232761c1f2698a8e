"""pdspec's serve_bench and vLLM's `vllm bench serve` agree on one stack and one load, at a
small size (`python -m loadtest.micro.bench_tools`, two interleaved rounds through the
shared stack's proxy).

Token accounting must agree exactly: both tools complete every request and count the same
output tokens. The timed figures are medians over the rounds, held to a loose band: this
2-core machine is noisy, and the band is there to catch a tool that measures something
else (a serve_bench that reported 1.66 times vLLM's output tokens/s), not a few percent."""

import json
import subprocess
import sys

from tests import harness

NUM_PROMPTS, OUTPUT_LEN = 8, 16


def test_serve_bench_and_vllm_bench_serve_agree(stack, tmp_path):
    argv = [sys.executable, "-m", "loadtest.micro.bench_tools", "--url", stack.proxy_url,
            "--input-len", "128", "--output-len", str(OUTPUT_LEN), "--num-prompts", str(NUM_PROMPTS),
            "--concurrency", "2", "--rounds", "2", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, cwd=harness.REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "bench_tools.json").read_text())
    print((tmp_path / "bench_tools.md").read_text())

    for round_ in report["rounds"]:
        for tool in ("serve_bench", "vllm_bench_serve"):
            assert round_[tool]["completed"] == NUM_PROMPTS, (tool, round_[tool])
            assert round_[tool]["output_tokens"] == NUM_PROMPTS * OUTPUT_LEN, (tool, round_[tool])
    summary = report["summary"]
    assert 0.95 <= summary["input_tokens"]["ratio_median"] <= 1.05
    assert 0.75 <= summary["output_tokens_per_s"]["ratio_median"] <= 1.33, summary["output_tokens_per_s"]
    assert 0.75 <= summary["duration_s"]["ratio_median"] <= 1.33, summary["duration_s"]
    for figure in ("ttft_ms_median", "itl_ms_median"):
        assert 0.6 <= summary[figure]["ratio_median"] <= 1.67, (figure, summary[figure])
    assert (tmp_path / "bench_tools.png").exists()
