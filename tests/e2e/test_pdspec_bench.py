"""`pdspec bench` as a user types it: it plans its stacks' ports, starts each stack with
`pdspec up`, benchmarks it and stops it. (From 2026-12-01 every stack it planned failed
`pdspec up`'s port check, two NIXL side channels overlapping, and no test ran the command.)
Here the smallest workload on the local default stack, with the KV pushed and early
decode on, so the bench's `--set` reaches every piece."""

import json
import socket
import subprocess
import sys

from tests import harness

BASE_PORT = 27000


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_pdspec_bench_starts_benchmarks_and_stops_its_stack(tmp_path):
    out = tmp_path / "out"
    argv = [
        sys.executable,
        "-m",
        "pdspec.cli",
        "bench",
        "--workload",
        "cpu-tiny",
        "--out",
        str(out),
        "--run-root",
        str(tmp_path / "runs"),
        "--base-port",
        str(BASE_PORT),
        "--no-progress",
        "--set",
        "model.kv_transfer=push",
        "proxy.kv_transfer.early_decode=true",
    ]
    done = subprocess.run(argv, cwd=harness.REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    (stack,) = json.loads((out / "bench.json").read_text())["stacks"]
    assert stack.get("error") is None and stack["overrides"]["proxy.kv_transfer.early_decode"] is True
    phases = stack["report"]["phases"]
    assert sorted(p["policy"] for p in phases) == ["always", "auto"]
    assert all(p["failed"] == 0 and p["completed"] == p["requests"] > 0 for p in phases)
    (summary,) = stack["report"]["ab_summary"]
    assert summary["k0_proposals"]["auto"] == summary["proposals"]["auto"] > 0
    assert summary["k0_proposals"]["always"] == 0
    assert (out / "bench.md").exists()
    # Stopped: nothing answers on the stack's ports any more.
    for port in (BASE_PORT, BASE_PORT + 10, BASE_PORT + 20):
        assert not answers(port), port
