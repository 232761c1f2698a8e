"""pdspec/cli.py: a proxy whose routing.tokenizer names no tokenizer stops at start-up
with one line that names it (exit 2), not a traceback."""

import subprocess
import sys


def test_a_proxy_with_a_tokenizer_that_does_not_load_says_so_and_exits(tmp_path):
    argv = [sys.executable, "-m", "pdspec.cli", "proxy", "--proxy.port", "31987"]
    argv += ["--proxy.routing.prefill_policy", "kv_aware", "--proxy.routing.tokenizer", str(tmp_path / "nothing")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"pdspec proxy: routing.tokenizer: {tmp_path / 'nothing'} does not exist"
