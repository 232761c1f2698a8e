"""`loadtest.prefill_bench --as-prefill-worker` measures what it says it measures: two engines
in one process, built as `pdspec prefill` builds its own (NixlConnector kv_producer, KV events
on), and each engine's counters read from its own processes.

On the H200 the drafter engine's counters read 0 in this mode (its engine core's metrics files
were not in the folder the benchmark read), so its table showed `0 / 0` K=0 proposals beside a
throughput figure; and once workers published KV events, the second engine of the benchmark
could not start (both bound the same port). Both are asserted here on the CPU."""

import json
import subprocess
import sys

from tests import harness
from tests.harness import REPO


def test_prefill_worker_benchmark_counts_each_engines_own_steps(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.prefill_bench",
            "--models-dir",
            str(harness.models_dir()),
            "--as-prefill-worker",
            "--baseline",
            "--modes",
            "auto",
            "full",
            "--prompts",
            "2",
            "--prompt-tokens",
            "512",
            "--mbt",
            "128",
            "--reps",
            "1",
            "--eager",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report_file = tmp_path / "prefill_bench.json"
    assert report_file.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    [run] = json.loads(report_file.read_text())
    print(json.dumps(run, indent=2))
    assert run["as_prefill_worker"]
    # The drafter engine's own features, on: what a prefill worker runs.
    assert run["features"]["k0_rule"] == "on"
    assert run["features"]["kv_only_pass"] == "on"
    auto, full, none = (run["counters"][mode] for mode in ("auto", "full", "none"))
    # Every prefill step is a K=0 proposal: 2 prompts x 512 tokens in 128-token chunks.
    steps = 2 * 512 // 128
    assert auto["pdspec_k0_proposals_total"] == auto["pdspec_proposals_total"] == steps
    assert auto["pdspec_kv_only_passes_total"] == steps  # the KV-only pass ran them all
    assert full["pdspec_k0_proposals_total"] == steps
    assert full["pdspec_kv_only_passes_total"] == 0  # `full`: vLLM's own drafter pass
    # The no-drafter engine's counters are its own: none of the drafter engine's steps.
    assert none["pdspec_proposals_total"] == 0
    assert all(rate > 0 for rates in run["tokens_per_s"].values() for rate in rates)
    assert result.returncode == 0
