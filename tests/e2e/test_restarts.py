"""A worker that dies comes back: `pdspec up` restarts the killed decode worker (a new
process, a new NIXL engine), the proxy readmits it once its checks pass, and requests
flow through it again with their KV really transferred (the decode worker's NIXL bytes
grow after the restart)."""

import os
import signal
import time

import httpx
import pytest

from tests import harness
from tests.prompts import completion_body, unique_prompt


def wait_for(condition, what: str, timeout_s: float = 240):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def new_decode_pid(stack, old: int):
    try:
        pid = harness.worker_pids(stack)["decode"]
    except AssertionError:  # between the old process and the new one
        return None
    return pid if pid != old else None


def ready(stack) -> bool:
    try:
        return httpx.get(stack.proxy_url + "/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.stops_stack  # it takes the shared stack's decode worker down for a minute: after the tests using it
def test_a_killed_decode_worker_is_restarted_readmitted_and_serves_with_kv_transferred(stack):
    old = harness.worker_pids(stack)["decode"]
    os.killpg(old, signal.SIGKILL)  # its process group: the API server and its engine core
    wait_for(lambda: not ready(stack), "the proxy ejects the dead decode worker", timeout_s=60)
    new = wait_for(lambda: new_decode_pid(stack, old), "pdspec up starts the decode worker again")
    wait_for(lambda: ready(stack), "the proxy readmits it")
    # A new process with a fresh Prometheus folder: no count of the dead one's is left
    # (a folder kept across the restart showed the old process's counters and gauges).
    before = harness.scrape(stack.decode_url).get("vllm:nixl_bytes_transferred_sum", 0)
    assert before == 0
    with httpx.Client(timeout=180) as client:
        response = client.post(stack.proxy_url + "/v1/completions", json=completion_body(unique_prompt(200)))
    assert response.status_code == 200, response.text
    assert harness.scrape(stack.decode_url)["vllm:nixl_bytes_transferred_sum"] > before
    assert harness.worker_pids(stack)["decode"] == new
    assert harness.wait_idle(stack.prefill_url) == (0, 0)  # nothing left pinned on the prefill worker


@pytest.mark.stops_stack
def test_a_hung_prefill_worker_is_ejected_then_readmitted_after_sigcont(stack):
    """SIGSTOP: the process is there and nothing answers. The health checks eject it (the
    proxy is not ready: its only prefill worker), SIGCONT brings it back, and it serves."""
    pid = harness.worker_pids(stack)["prefill"]
    os.killpg(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not ready(stack), "the proxy ejects the hung prefill worker", timeout_s=60)
    finally:
        os.killpg(pid, signal.SIGCONT)
    wait_for(lambda: ready(stack), "the proxy readmits it after SIGCONT", timeout_s=120)
    with httpx.Client(timeout=180) as client:
        response = client.post(stack.proxy_url + "/v1/completions", json=completion_body(unique_prompt(120)))
    assert response.status_code == 200, response.text
    assert harness.worker_pids(stack)["prefill"] == pid  # the same process: not restarted
