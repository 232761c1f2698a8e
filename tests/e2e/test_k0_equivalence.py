"""The K=0 equivalence harness (loadtest/correctness/k0_equivalence.py) at a size that fits CI:
long prompts chunked at 512 tokens with max_tokens 1, 2 or 64, alone and mixed with
short decode requests; `auto` against `always` on one engine."""

import json
import subprocess
import sys

from tests import harness
from tests.harness import REPO


def test_auto_and_always_give_equal_outputs_and_spec_counters(tmp_path):
    out = tmp_path / "equivalence.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.k0_equivalence",
            "--models-dir",
            str(harness.models_dir()),
            "--long",
            "6",
            "--short",
            "8",
            "--long-tokens",
            "1200",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    scenarios = json.loads(out.read_text())
    print("\n".join(line for line in result.stdout.splitlines() if line.startswith("|")))
    assert [s["scenario"] for s in scenarios] == ["long alone", "long + short"]
    for s in scenarios:
        assert s["equal_outputs"] == s["requests"]
        assert s["spec_counters_auto"] == s["spec_counters_always"]
        assert s["k0_auto"] > 0 and s["k0_always"] == 0
        assert s["proposals_auto"] == s["proposals_always"]  # same steps, only K differs
    assert result.returncode == 0
