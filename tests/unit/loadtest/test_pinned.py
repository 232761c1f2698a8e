"""Pinned processes for the micro benchmarks: pinned as asked, stopped with everything they
started, their CPU time read, and a readiness wait that gives up on a dead process."""

import sys

import psutil
import pytest

from loadtest.micro.pinned import cpu_seconds, start, stop, wait_http
from tests.harness import wait_for


def test_a_process_runs_on_its_cpus_and_stops_with_its_children(tmp_path):
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    process = start([sys.executable, "-c", script], cpus="0", log=tmp_path / "child.log")
    parent = psutil.Process(process.pid)
    assert wait_for(lambda: parent.children(), timeout_s=10)
    child = parent.children()[0]
    assert parent.cpu_affinity() == [0]  # taskset exec'd the program: its pid is the pinned one
    stop(process)
    assert process.poll() is not None
    assert wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, timeout_s=10)


def test_cpu_time_counts_the_process_and_its_children():
    busy = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
    process = start([sys.executable, "-c", busy], cpus="0")
    try:
        assert wait_for(lambda: cpu_seconds(process.pid) > 0.3, timeout_s=20)
    finally:
        stop(process)
    assert cpu_seconds(process.pid) == 0.0  # gone


def test_waiting_on_a_process_that_exited_fails_at_once():
    process = start([sys.executable, "-c", "raise SystemExit(3)"], cpus="0")
    with pytest.raises(RuntimeError, match=r"exited \(3\)"):
        wait_http("http://127.0.0.1:9/health", timeout_s=30, process=process)
