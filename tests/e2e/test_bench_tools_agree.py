"""pdspec's serve_bench and vLLM's `vllm bench serve` agree on one stack and one load, at a
small size (`python -m loadtest.micro.bench_tools`, three rounds in rotating order through
the shared stack's proxy, vLLM's tool greedy as serve_bench is).

On the same prompts (serve_bench's `--dataset vllm-random`) the accounting must agree
exactly: every request completed, the same input and output tokens, and the same decode
acceptance (greedy, the same outputs). The timed figures are medians over the rounds, held
to a loose band: this 2-core machine is noisy, and the band is there to catch a tool that
measures something else (serve_bench once read 1.66 times vLLM's output tokens/s: vLLM's
tool sampled at temperature 1.0, which accepts fewer drafts: the acceptance check catches
that exactly), not a few percent."""

import json
import subprocess
import sys

from tests import harness

NUM_PROMPTS, OUTPUT_LEN = 16, 32  # about 4 s a run: shorter runs are mostly start-up noise


def test_serve_bench_and_vllm_bench_serve_agree(stack, tmp_path):
    argv = [sys.executable, "-m", "loadtest.micro.bench_tools", "--url", stack.proxy_url,
            "--input-len", "128", "--output-len", str(OUTPUT_LEN), "--num-prompts", str(NUM_PROMPTS),
            "--concurrency", "2", "--rounds", "3", "--decode-url", stack.decode_url, "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, cwd=harness.REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "bench_tools.json").read_text())
    print((tmp_path / "bench_tools.md").read_text())

    for round_ in report["rounds"]:
        for tool in ("serve_bench", "serve_bench_vllm_prompts", "vllm_bench_serve"):
            assert round_[tool]["completed"] == NUM_PROMPTS, (tool, round_[tool])
            assert round_[tool]["output_tokens"] == NUM_PROMPTS * OUTPUT_LEN, (tool, round_[tool])
    same_prompts = report["summary_vllm_prompts"]
    assert same_prompts["input_tokens"]["ratios"] == [1.0, 1.0, 1.0]
    assert 0.98 <= same_prompts["decode_acceptance_length"]["ratio_median"] <= 1.02, same_prompts
    assert 0.67 <= same_prompts["output_tokens_per_s"]["ratio_median"] <= 1.5, same_prompts["output_tokens_per_s"]
    assert 0.67 <= same_prompts["duration_s"]["ratio_median"] <= 1.5, same_prompts["duration_s"]
    for figure in ("ttft_ms_median", "itl_ms_median", "tpot_ms_median"):
        assert 0.6 <= same_prompts[figure]["ratio_median"] <= 1.67, (figure, same_prompts[figure])
    assert (tmp_path / "bench_tools.png").exists()
