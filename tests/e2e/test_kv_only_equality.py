"""The KV-only drafter pass writes the drafter KV the full drafter pass writes
(loadtest/correctness/kv_only_equality.py): the same prompts on one engine, once with vLLM's full
drafter forward on K=0 steps and once with the KV-only pass, compared block by block.

Eager, as pdspec's workers run (`enforce_eager`): the pass calls the very modules and
kernels the full forward calls, in the same order, on the same inputs, so the cache
must be bitwise equal."""

import json
import subprocess
import sys

from tests import harness
from tests.harness import REPO


def run_equality(tmp_path, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    """The equality tool's report on 4 prompts (and its process, for the exit status)."""
    out = tmp_path / "equality.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.kv_only_equality",
            "--models-dir",
            str(harness.models_dir()),
            "--prompts",
            "4",
            *args,
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    print(json.dumps(report, indent=2))
    return report, result


def test_kv_only_pass_writes_the_full_passs_drafter_kv(tmp_path):
    report, result = run_equality(tmp_path, "--blocks", "40", "75")
    assert report["k0_steps"] == report["steps"] > 0  # every step proposed with K=0
    assert report["kv_only_calls_in_full_run"] == 0  # the reference run used vLLM's forward
    assert report["kv_only_calls_in_kv_only_run"] == report["steps"]  # and this one the pass, every step
    assert report["blocks"] == sum(report["prompt_tokens"]) // report["block_size"]
    assert report["blocks_missing_in_kv_only"] == 0
    assert report["blocks_bitwise_equal"] == report["blocks"], report
    assert result.returncode == 0


def test_dflash_kv_only_pass_writes_the_full_passs_context_kv(tmp_path):
    """DFlash on the V1 runner (prefill_worker/engine/kv_only/dflash.py): the pass runs vLLM's
    own context precompute alone, so every drafter layer's context K/V is bitwise the full
    pass's. The drafter is the small target's untrained DFlash drafter (pdspec.models.dflash)."""
    from pdspec.models.dflash import write_dflash_drafter

    drafter = write_dflash_drafter(tmp_path / "dflash", k=4)
    report, result = run_equality(
        tmp_path, "--drafter", str(drafter), "--method", "dflash", "--k", "4", "--blocks", "10", "25"
    )
    assert report["method"] == "dflash"
    assert report["k0_steps"] == report["steps"] > 0
    assert report["kv_only_calls_in_full_run"] == 0
    assert report["kv_only_calls_in_kv_only_run"] == report["steps"]
    assert report["blocks"] == sum(report["prompt_tokens"]) // report["block_size"]
    assert report["max_abs_value"] > 0  # the blocks hold K/V, not an untouched cache
    assert report["blocks_bitwise_equal"] == report["blocks"], report
    assert result.returncode == 0
