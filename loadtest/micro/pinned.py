"""Processes pinned to CPU cores for the micro benchmarks: started under `taskset` in a
session of their own, waited for over HTTP, their CPU time read, and stopped by their
process group (never by name), so a benchmark ends exactly what it started.

Failure policy: `wait_http` raises when the URL does not answer below 500 in time, or
at once when the process it waits for has exited (its log says why); `stop` escalates to
SIGKILL when SIGTERM is not obeyed within its timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil


def start(argv: list[str], cpus: str, env: dict | None = None, log: Path | None = None) -> subprocess.Popen:
    """`argv` under `taskset -c cpus` (taskset execs it: the pid is the program's own), in a
    new session; its output to `log`, or discarded."""
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (the child holds it)
    try:
        return subprocess.Popen(
            ["taskset", "-c", cpus, *argv],
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if log:
            out.close()


def stop(process: subprocess.Popen, timeout_s: float = 10) -> None:
    """SIGTERM to the process's group, SIGKILL if it is still there after `timeout_s`."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout_s)
    except ProcessLookupError:
        pass


def wait_http(url: str, timeout_s: float = 30, process: subprocess.Popen | None = None) -> None:
    """Until `url` answers GET with a status below 500."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the process behind {url} exited ({process.returncode}) before it answered")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)  # poll interval of the readiness check
    raise RuntimeError(f"{url} did not come up in {timeout_s:g} s")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its children so far; 0 once it is gone."""
    try:
        process = psutil.Process(pid)
        processes = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for each in processes:
        try:
            times = each.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total
