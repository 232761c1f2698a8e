"""An idle worker does not burn a core (NIXL's progress thread no longer busy-spins),
nor does a prefill worker whose only work is a prompt's KV held for its decode worker to
read (the kv_hold_wait engine feature; with the model in the engine core, in_core_worker,
no shared-memory queue is left to spin on: short_spin bounded it before), and KV transfers
still work afterwards."""

import time

import httpx

from loadtest.serving.kv_hold_cpu import tree_cpu_seconds
from proxy.apis.legs import PREFILL_KV_REQUEST
from tests import harness
from tests.prompts import completion_body, unique_prompt

WINDOW_S = 1.0


def wait_quiescent(stack, timeout_s: float = 30) -> None:
    """No request running or waiting on either worker (their own gauges)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metrics = [harness.scrape(url) for url in (stack.prefill_url, stack.decode_url)]
        # A worker that has served nothing yet exports neither gauge.
        if all(
            m.get("vllm:num_requests_running", 0) == 0 and m.get("vllm:num_requests_waiting", 0) == 0 for m in metrics
        ):
            return
        time.sleep(0.2)  # poll interval
    raise AssertionError("workers never became idle")


def calm_windows(pids: dict[str, int], limit_cores: float = 0.1, windows: int = 15) -> tuple[bool, list]:
    """Whether three consecutive one-second windows came under `limit_cores` per worker
    within `windows` (an engine finishes bookkeeping for a moment after its last request),
    and each window's cores per worker."""
    history, calm = [], 0
    for _ in range(windows):
        start = {role: tree_cpu_seconds(pid) for role, pid in pids.items()}
        wall = time.monotonic()
        time.sleep(WINDOW_S)  # one measurement window
        elapsed = time.monotonic() - wall
        cores = {role: (tree_cpu_seconds(pid) - start[role]) / elapsed for role, pid in pids.items()}
        history.append(cores)
        calm = calm + 1 if all(used < limit_cores for used in cores.values()) else 0
        if calm == 3:
            return True, history
    return False, history


def test_idle_workers_use_under_a_tenth_of_a_core_and_transfers_still_work(stack, client):
    wait_quiescent(stack)
    # With nixl's default (0 us) every window is about 1.0 core (see the unit test).
    calm, history = calm_windows(harness.worker_pids(stack))
    assert calm, history

    before = harness.scrape(stack.decode_url)["vllm:nixl_bytes_transferred_sum"]
    assert client.post(stack.proxy_url + "/v1/completions", json=completion_body(unique_prompt())).status_code == 200
    assert harness.scrape(stack.decode_url)["vllm:nixl_bytes_transferred_sum"] > before


def test_a_prefill_worker_holding_kv_for_a_read_does_not_burn_a_core(stack, client):
    """After a prefill its request stays, blocks held, until the decode worker reads the KV.
    vLLM's engine then steps every millisecond and its processes spin between steps: 1.4
    cores of this machine for one held prompt, measured before kv_hold_wait and short_spin.
    Held here by a prefill leg sent to the prefill worker alone; then read by a decode
    leg, which frees it, and the transfer is checked."""
    wait_quiescent(stack)
    body = completion_body(unique_prompt(60), max_tokens=1)
    with httpx.Client(timeout=120) as direct:
        reply = direct.post(
            stack.prefill_url + "/v1/completions", json={**body, "kv_transfer_params": dict(PREFILL_KV_REQUEST)}
        )
        params = reply.json()["kv_transfer_params"]
        try:
            calm, history = calm_windows({"prefill": harness.worker_pids(stack)["prefill"]}, limit_cores=0.2)
        finally:  # the decode worker reads the KV: the prefill worker frees it
            before = harness.scrape(stack.decode_url)["vllm:nixl_bytes_transferred_sum"]
            read = direct.post(stack.decode_url + "/v1/completions", json={**body, "kv_transfer_params": params})
    assert calm, history
    assert read.status_code == 200 and harness.scrape(stack.decode_url)["vllm:nixl_bytes_transferred_sum"] > before
