"""pdspec's serve_bench and vLLM's `vllm bench serve` agree on one stack and one load, at a
small size (`python -m loadtest.micro.bench_tools` through the shared stack's proxy, vLLM's
tool greedy as serve_bench is).

On the same prompts (serve_bench's `--dataset vllm-random`) the accounting must agree
exactly: every request completed, the same input and output tokens, and the same decode
acceptance (greedy, the same outputs). serve_bench once read 1.66 times vLLM's output
tokens/s because vLLM's tool sampled at temperature 1.0, which accepts fewer drafts: the
acceptance check catches that exactly. The timed figures are not held to a band here: on
this 2-core machine, with the workers, the proxy and the tool sharing it, CI saw one
tool's TTFT median 3 times the other's in two rounds of three and the reverse in the
third. That the two tools time the same things is tested where the server sets the time
(tests/unit/loadtest/test_bench_tools_paced.py: both within 10% of each other and of the
pacing); here the timed figures only have to be there and be consistent."""

import json
import subprocess
import sys

from tests import harness

NUM_PROMPTS, OUTPUT_LEN = 16, 32  # about 4 s a run: shorter runs are mostly start-up noise


def test_serve_bench_and_vllm_bench_serve_agree(stack, tmp_path):
    argv = [
        sys.executable,
        "-m",
        "loadtest.micro.bench_tools",
        "--url",
        stack.proxy_url,
        "--input-len",
        "128",
        "--output-len",
        str(OUTPUT_LEN),
        "--num-prompts",
        str(NUM_PROMPTS),
        "--concurrency",
        "2",
        "--rounds",
        "1",
        "--decode-url",
        stack.decode_url,
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(argv, cwd=harness.REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "bench_tools.json").read_text())
    print((tmp_path / "bench_tools.md").read_text())

    for round_ in report["rounds"]:
        for tool in ("serve_bench", "serve_bench_vllm_prompts", "vllm_bench_serve"):
            assert round_[tool]["completed"] == NUM_PROMPTS, (tool, round_[tool])
            assert round_[tool]["output_tokens"] == NUM_PROMPTS * OUTPUT_LEN, (tool, round_[tool])
    same_prompts = report["summary_vllm_prompts"]
    assert same_prompts["input_tokens"]["ratios"] == [1.0]
    assert 0.98 <= same_prompts["decode_acceptance_length"]["ratio_median"] <= 1.02, same_prompts
    for round_ in report["rounds"]:
        for tool in ("serve_bench", "serve_bench_vllm_prompts", "vllm_bench_serve"):
            figures = round_[tool]
            assert figures["ttft_ms_median"] > 0 and figures["itl_ms_median"] > 0, (tool, figures)
            # Throughput is the tokens over the run's window, as both tools define it.
            window = figures["output_tokens"] / figures["output_tokens_per_s"]
            assert abs(window - figures["duration_s"]) <= 0.02 * figures["duration_s"], (tool, figures)
    assert (tmp_path / "bench_tools.png").exists()
