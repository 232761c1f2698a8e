"""`python -m loadtest.serve_bench --ab` through the real 1P1D stack (`pdspec up`).

Only `--url` and the workload are given: the workers and the run folder come from
pdspec's settings (here its environment variables, as a local `pdspec up` would have
them), which is the default path users take. The prefill worker must propose with K=0
in every step of the `auto` phases and in none of the `always` phases.
"""

import json
import os
import subprocess
import sys
from urllib.parse import urlparse

from tests import harness

PHASE_FIELDS = (
    "policy",
    "requests",
    "failed",
    "ttft_ms",
    "itl_ms",
    "output_tokens_per_s",
    "prefill_tokens_per_s",
    "prefill_proposals",
    "prefill_k0_proposals",
    "decode_acceptance_length",
)


def test_serve_bench_ab_through_the_proxy(stack, tmp_path):
    env = {
        **os.environ,
        "PDSPEC_PREFILL__PORT": str(urlparse(stack.prefill_url).port),
        "PDSPEC_DECODE__PORT": str(urlparse(stack.decode_url).port),
        "PDSPEC_RUN_DIR": str(stack.run_dir),
    }
    argv = [
        sys.executable,
        "-m",
        "loadtest.serve_bench",
        "--url",
        stack.proxy_url,
        "--ab",
        "--phases",
        "1",
        "--num-prompts",
        "4",
        "--concurrency",
        "2",
        "--input-len",
        "600",
        "--output-len",
        "4",
        "--goodput",
        "ttft:600000",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(argv, cwd=harness.REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    report = json.loads((tmp_path / "serve_bench.json").read_text())
    assert report["prefill_url"] == stack.prefill_url and report["decode_url"] == stack.decode_url
    phases = report["phases"]
    assert [p["policy"] for p in phases] == ["auto", "always"]
    for phase in phases:
        for field in PHASE_FIELDS:
            assert field in phase, field
        assert (phase["requests"], phase["failed"], phase["output_tokens"]) == (4, 0, 16)
        for stat in ("mean", "median", "p99"):
            assert phase["ttft_ms"][stat] > 0 and phase["itl_ms"][stat] > 0
        assert phase["output_tokens_per_s"] > 0 and phase["good_requests"] == 4
        # 4 prompts of 600 tokens on the prefill worker, none recomputed elsewhere
        assert phase["workers"]["prefill"]["vllm:prompt_tokens_total"] == 4 * 600
        assert phase["prefill_tokens_per_s"] > 0
        assert phase["decode_acceptance_length"] >= 1.0
        assert phase["prefill_proposals"] >= 4 * 600 // 512  # 2,400 prompt tokens at 512 a step
        # The prefill worker's queue, read from its /metrics while the phase ran.
        assert phase["prefill_queue_samples"] > 0 and phase["prefill_queue_gaps"] == 0
        assert 0.0 <= phase["prefill_saturation_share"] <= 1.0
        assert phase["saturated"] == (phase["prefill_saturation_share"] >= 0.89)
    auto, always = phases
    assert auto["prefill_k0_proposals"] == auto["prefill_proposals"]
    assert always["prefill_k0_proposals"] == 0
    assert report["ab_summary"][0]["k0_proposals"] == {"auto": auto["prefill_proposals"], "always": 0}
    assert "| concurrency 2 | always |" in (tmp_path / "serve_bench.md").read_text()
    # serve_bench leaves the stack as it found it: `auto`
    assert (stack.run_dir / "prefill" / "drafts-policy").read_text().strip() == "auto"
