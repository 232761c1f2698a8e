"""`pdspec up --restart never` keeps fail-fast: a child that dies stops the whole stack with
an error naming the child and the tail of its log (the default restarts it:
tests/e2e/test_restarts.py)."""

import os
import signal
import subprocess
import sys
import threading

import psutil
import pytest

from tests.harness import REPO

pytestmark = pytest.mark.after_stack

PORT = 22900


def test_a_dead_child_stops_a_fail_fast_stack_naming_it(tmp_path):
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pdspec.cli",
            "up",
            "--layout",
            "colocated",
            "--colocated.port",
            str(PORT),
            "--restart",
            "never",
            "--run_dir",
            str(tmp_path),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        for line in up.stdout:
            lines.append(line)
            if line.startswith("pdspec up: ready:"):
                break
        else:
            raise AssertionError("pdspec up exited before it was ready:\n" + "".join(lines[-40:]))
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.extend(up.stdout), daemon=True)
        reader.start()
        (worker,) = [c for c in psutil.Process(up.pid).children() if "pdspec.worker.serve" in " ".join(c.cmdline())]
        os.killpg(worker.pid, signal.SIGKILL)  # the worker's group, its engine core too: a crash
        code = up.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=120)
    output = "".join(rest)
    assert code != 0, output
    assert "colocated worker exited with code" in output, output
    assert "restarting" not in output  # fail-fast: no second start
