"""The decode worker's stale-KV guard with real workers (pdspec/worker/engine/stale_kv.py):
a decode request that reaches the scheduler after its prefill worker's KV lease ran out is
prefilled on the decode worker, never read from blocks the prefill worker freed and reused.

What the chaos soak hit, made to happen on purpose: the legs are sent by hand (as the
proxy sends them); the decode worker's engine-core process is stopped (SIGSTOP) while the
decode leg reaches its API server, as a decode engine stalled on a dead NIXL peer is; the
prefill worker's lease (6 s here) runs out and other prompts take its few blocks; then the
engine runs again. Without the guard the decode worker read the long prompt's KV as the
first prompt's and answered wrongly (the prefill worker logs "Potentially invalid KV
blocks ... were retrieved"); with it, the answer is the prefill worker's own greedy one."""

from __future__ import annotations

import signal
import threading

import httpx
import psutil
import pytest

from proxy.legs import PREFILL_KV_REQUEST
from tests import harness
from tests.prompts import completion_body, unique_prompt

pytestmark = pytest.mark.after_stack

BASE = 19800
LEASE_S = 6  # the decode worker trusts a prefill's KV for 3 s after its arrival
BLOCKS = 17  # x 128 tokens: a few prompts in turn take the first one's freed blocks


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    run = tmp_path_factory.mktemp("stale_kv")
    prefill = harness.start_worker("prefill", run / "p", BASE + 100, BASE + 300, cpu_omp_threads_bind="0",
                                   kv_lease_s=LEASE_S, extra_vllm_args=["--num-gpu-blocks-override", str(BLOCKS),
                                                                        "--no-enable-prefix-caching"])  # fmt: skip
    decode = harness.start_worker("decode", run / "d", BASE + 200, BASE + 400, cpu_omp_threads_bind="1",
                                  kv_lease_s=LEASE_S, extra_vllm_args=["--no-enable-prefix-caching"])  # fmt: skip
    try:
        harness.wait_healthy(prefill.url, prefill.process, run / "p" / f"prefill-{BASE + 100}.log")
        harness.wait_healthy(decode.url, decode.process, run / "d" / f"decode-{BASE + 200}.log")
        yield prefill, decode, run / "p" / f"prefill-{BASE + 100}.log"
    finally:
        prefill.stop()
        decode.stop()


def engine_core(server: harness.Server) -> psutil.Process:
    """The decode worker's engine-core process (its scheduler), a child of its API server."""
    (core,) = [p for p in psutil.Process(server.process.pid).children(recursive=True)
               if "EngineCore" in " ".join(p.cmdline()) or p.name().startswith("VLLM::EngineCore")]  # fmt: skip
    return core


def test_a_decode_leg_past_its_prefill_workers_lease_is_prefilled_on_the_decode_worker(workers):
    prefill, decode, prefill_log = workers
    prompt = unique_prompt(60)
    body = completion_body(prompt, max_tokens=24)
    with httpx.Client(timeout=120) as client:
        reference = client.post(prefill.url + "/v1/completions", json=body).json()["choices"][0]["text"]
        prefill_leg = {**body, "max_tokens": 1, "kv_transfer_params": dict(PREFILL_KV_REQUEST)}
        params = client.post(prefill.url + "/v1/completions", json=prefill_leg).json()["kv_transfer_params"]
        recomputed_before = harness.scrape(decode.url).get("pdspec_stale_kv_recomputed_total", 0.0)

        core = engine_core(decode)
        core.send_signal(signal.SIGSTOP)
        reply: dict = {}
        try:
            leg = threading.Thread(target=lambda: reply.update(r=httpx.post(
                decode.url + "/v1/completions", json={**body, "kv_transfer_params": params}, timeout=300)))
            leg.start()
            # The lease runs out on the prefill worker (it reaps on its steps: keep it stepping) ...
            def lease_ran_out() -> bool:
                if "Releasing expired KV blocks" in prefill_log.read_text():
                    return True
                client.post(prefill.url + "/v1/completions", json=completion_body(unique_prompt(20), max_tokens=1))
                return False

            assert harness.wait_for(lease_ran_out, timeout_s=60), "the prefill worker's lease did not run out"
            # ... and prompts of about 8 blocks each, in turn, rotate its free blocks: the
            # freed ones are written over with other prompts' KV.
            for _ in range(4):
                client.post(prefill.url + "/v1/completions", json=completion_body(unique_prompt(220), max_tokens=1))
        finally:
            core.send_signal(signal.SIGCONT)
        leg.join(timeout=300)

    assert reply["r"].status_code == 200, reply["r"].text
    assert reply["r"].json()["choices"][0]["text"] == reference
    assert harness.scrape(decode.url).get("pdspec_stale_kv_recomputed_total", 0.0) == recomputed_before + 1
    assert "Potentially invalid KV blocks" not in prefill_log.read_text()  # nobody read the freed blocks
