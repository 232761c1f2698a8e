"""A prefill worker's KV under pressure, with real workers at a small size: a prefill worker
whose KV holds about three prompts and whose KV lease is 6 s, and a decode worker that
takes one request at a time (`--max-num-seqs 1`). One pair for both halves (starting a
pair costs about a minute).

Admission by KV room (proxy/admission/kv_room.py): the decode worker cannot take KV as fast as the
prefill worker makes it, so the prefill worker's KV fills with prompts held for transfers:
the KV bottleneck of 1P1D on one GPU, where prefill legs timed out (504) while the prefill
worker waited for blocks. The same burst goes through two proxies in front of the same
workers, one after the other: without admission, prefill legs time out; with
`admission.prefill_kv`, the requests wait in the proxy for room instead, and every one is
served.

The decode worker's stale-KV guard (decode_worker/engine/stale_kv.py): a decode request
that reaches the scheduler after its prefill worker's KV lease ran out is prefilled on the
decode worker, never read from blocks the prefill worker freed and reused. What the chaos
soak hit, made to happen on purpose: the legs are sent by hand (as the proxy sends them);
the decode worker's engine-core process is stopped (SIGSTOP) while the decode leg reaches
its API server, as a decode engine stalled on a dead NIXL peer is; the prefill worker's
lease runs out and other prompts take its few blocks; then the engine runs again. Without
the guard the decode worker read other prompts' KV as this one's and answered wrongly (the
prefill worker logs "Potentially invalid KV blocks ... were retrieved"); with it, the
answer is the prefill worker's own greedy one."""

from __future__ import annotations

import asyncio
import json
import signal
import threading

import httpx
import psutil
import pytest

from proxy.apis.legs import PREFILL_KV_REQUEST
from tests import harness
from tests.prompts import completion_body, unique_prompt

pytestmark = pytest.mark.after_stack

BASE = 19600
BLOCKS = 17  # x 128 tokens: 2,176; 16 are too few for the 2,048-token context with the drafter
LEASE_S = 6  # the decode worker trusts a prefill's KV for 3 s after its arrival
BURST, OUTPUT_TOKENS, PREFILL_TIMEOUT_S = 10, 256, 3.0  # the decode worker: a few seconds a request
NO_PREFIX_CACHE = "--no-enable-prefix-caching"  # freed blocks go back to the free queue, to be reused


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    run = tmp_path_factory.mktemp("kv_pressure")
    prefill = harness.start_worker(
        "prefill",
        run / "p",
        BASE + 100,
        BASE + 300,
        cpu_omp_threads_bind="0",
        kv_lease_s=LEASE_S,
        extra_vllm_args=["--num-gpu-blocks-override", str(BLOCKS), NO_PREFIX_CACHE],
    )
    decode = harness.start_worker(
        "decode",
        run / "d",
        BASE + 200,
        BASE + 400,
        cpu_omp_threads_bind="1",
        kv_lease_s=LEASE_S,
        extra_vllm_args=["--max-num-seqs", "1", NO_PREFIX_CACHE],
    )
    prefill.log = run / "p" / f"prefill-{BASE + 100}.log"
    try:
        harness.wait_healthy(prefill.url, prefill.process, prefill.log)
        harness.wait_healthy(decode.url, decode.process, run / "d" / f"decode-{BASE + 200}.log")
        yield prefill, decode
    finally:
        prefill.stop()
        decode.stop()


async def burst(url: str) -> list[int]:
    async def one(client: httpx.AsyncClient) -> int:
        body = completion_body(unique_prompt(150), max_tokens=OUTPUT_TOKENS, ignore_eos=True)
        return (await client.post(url + "/v1/completions", json=body)).status_code

    async with httpx.AsyncClient(timeout=300) as client:
        return list(await asyncio.gather(*(one(client) for _ in range(BURST))))


def through_proxy(workers, port: int, **settings) -> tuple[list[int], dict]:
    prefill, decode = workers
    assert harness.wait_idle(prefill.url, timeout_s=60) == (0, 0)  # the last run's KV gone
    proxy = harness.start_proxy(
        port,
        **harness.merged(
            {
                "prefill_urls": [prefill.url],
                "decode_urls": [decode.url],
                "worker_client": {"prefill_timeout_s": PREFILL_TIMEOUT_S},
                "admission": {"queue_timeout_s": 240},
                "kv_transfer": {"source_ports": [str(BASE + 300)]},
            },
            settings,
        ),
    )
    try:
        harness.wait_healthy(proxy.url, proxy.process, path="/ready")
        statuses = asyncio.run(burst(proxy.url))
        return statuses, {
            name: harness.scrape_labeled(proxy.url, name)
            for name in ("pdspec_proxy_leg_failures_total", "pdspec_proxy_kv_room_waits_total")
        }
    finally:
        proxy.stop()


def test_the_prompts_fill_the_prefill_workers_kv_with_a_few(workers):
    """The premise: one prompt takes several of the prefill worker's 17 blocks."""
    prefill, _ = workers
    reply = httpx.post(
        prefill.url + "/v1/completions", json=completion_body(unique_prompt(150), max_tokens=1), timeout=60
    ).json()
    assert 4 * 128 <= reply["usage"]["prompt_tokens"] <= 6 * 128, reply["usage"]


def test_without_admission_prefill_legs_time_out_waiting_for_kv(workers):
    statuses, metrics = through_proxy(workers, BASE)
    failures = metrics["pdspec_proxy_leg_failures_total"]
    assert statuses.count(504) >= 1, statuses
    assert failures.get((("leg", "prefill"), ("reason", "timeout")), 0) >= 1, failures


def test_with_admission_every_request_waits_for_room_and_is_served(workers):
    statuses, metrics = through_proxy(
        workers, BASE + 1, admission={"prefill_kv": True, "prefill_kv_read_interval_s": 0.25}
    )
    assert statuses == [200] * BURST, statuses
    assert metrics["pdspec_proxy_leg_failures_total"] == {}, json.dumps(metrics)
    waits = metrics["pdspec_proxy_kv_room_waits_total"]
    assert waits[(("outcome", "admitted"),)] >= 1 and waits[(("outcome", "timeout"),)] == 0, waits


def engine_core(server: harness.Server) -> psutil.Process:
    """The decode worker's engine-core process (its scheduler), a child of its API server."""
    (core,) = [
        p
        for p in psutil.Process(server.process.pid).children(recursive=True)
        if "EngineCore" in " ".join(p.cmdline()) or p.name().startswith("VLLM::EngineCore")
    ]
    return core


def test_a_decode_leg_past_its_prefill_workers_lease_is_prefilled_on_the_decode_worker(workers):
    prefill, decode = workers
    prefill_log = prefill.log
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
            leg = threading.Thread(
                target=lambda: reply.update(
                    r=httpx.post(
                        decode.url + "/v1/completions", json={**body, "kv_transfer_params": params}, timeout=300
                    )
                )
            )
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
