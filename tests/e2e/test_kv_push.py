"""`kv_transfer = push` (vLLM's NixlPushConnector: the prefill worker WRITEs the prompt's
KV into blocks the decode worker registered) on a real 1P1D stack: the workers say so in
their info, greedy output equals a colocated server's, the decode worker computes at most
the last prompt token itself, and the prefill worker keeps no KV afterwards. The one-GPU
profile takes push because UCX serves a pull's READ over TCP where GPUs share no NVLink
(0.44 GB/s measured on one H200, loadtest/results/handoff/h200-one-gpu/)."""

import asyncio
import contextlib

import httpx
import pytest

from pdspec.worker.launch import pause_steps_file
from tests import harness
from tests.e2e.test_kv_transfer import by_source, scrape_with_sources
from tests.prompts import completion_body, completion_outputs, unique_prompt

PUSH = ["--model.kv_transfer", "push"]
EARLY_PORT, EARLY_FAULT_PORT = 25050, 25051


@pytest.fixture(scope="module")
def push_stack(tmp_path_factory):
    stack = harness.start_stack(tmp_path_factory.mktemp("push"), 25000, [*harness.TEST_STACK_ARGS, *PUSH])
    yield stack
    stack.stop()


def test_both_workers_report_the_push_connector(push_stack):
    for url in (push_stack.prefill_url, push_stack.decode_url):
        (labels,) = harness.scrape_labeled(url, "pdspec_worker_info")
        assert dict(labels)["kv_connector"] == "push", url


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_pushed_kv_gives_the_colocated_output(push_stack, reference_outputs, client, stream):
    assert completion_outputs(client, push_stack.proxy_url, stream) == reference_outputs["completions"]


def assert_received_not_computed(client, proxy_url: str, decode_url: str) -> None:
    """One 400-word prompt through `proxy_url`: the decode worker received all of it but the
    last token over NIXL and computed at most that one itself."""
    before = scrape_with_sources(decode_url)
    response = client.post(proxy_url + "/v1/completions", json=completion_body(unique_prompt(400)))
    assert response.status_code == 200
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    after = scrape_with_sources(decode_url)
    transferred = by_source(after, "external_kv_transfer") - by_source(before, "external_kv_transfer")
    computed = by_source(after, "local_compute") - by_source(before, "local_compute")
    assert transferred >= prompt_tokens - 1 and computed <= 1, (prompt_tokens, transferred, computed)


def test_the_decode_worker_receives_the_prompt_rather_than_computing_it(push_stack, client):
    assert_received_not_computed(client, push_stack.proxy_url, push_stack.decode_url)
    # The prefill worker wrote the blocks and let them go: nothing left held for a decode.
    assert harness.wait_idle(push_stack.prefill_url) == (0, 0)
    prefill = harness.scrape(push_stack.prefill_url)
    assert prefill.get("vllm:nixl_num_failed_transfers_total", 0) == 0


def test_the_kv_only_drafter_pass_stays_on_with_push(push_stack):
    (state,) = [
        dict(labels)["state"]
        for labels in harness.scrape_labeled(push_stack.prefill_url, "pdspec_engine_feature")
        if dict(labels)["feature"] == "kv_only_pass"
    ]
    assert state == "on"


# --- early decode: the decode leg sent with the prefill leg (proxy/flow/early_decode.py) ----------


def early_proxy(stack, port: int, **settings) -> harness.Server:
    proxy = harness.start_proxy(
        port,
        **harness.merged(
            {
                "prefill_urls": [stack.prefill_url],
                "decode_urls": [stack.decode_url],
                "kv_transfer": {"early_decode": True, "source_ports": ["25300"]},
            },
            settings,
        ),
    )
    harness.wait_healthy(proxy.url, proxy.process, path="/ready")
    return proxy


def early_outcomes(proxy_url: str) -> dict[str, float]:
    return {
        dict(labels)["outcome"]: value
        for labels, value in harness.scrape_labeled(proxy_url, "pdspec_proxy_early_decodes_total").items()
    }


@pytest.fixture(scope="module")
def early(push_stack):
    proxy = early_proxy(push_stack, EARLY_PORT)
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_early_decode_gives_the_colocated_output(push_stack, early, reference_outputs, client, stream):
    before = early_outcomes(early.url).get("used", 0)
    assert completion_outputs(client, early.url, stream) == reference_outputs["completions"]
    # Every request but the proxy's very first (which learns where the KV comes from) went early.
    assert early_outcomes(early.url)["used"] - before >= len(reference_outputs["completions"]) - 1
    assert harness.wait_idle(push_stack.decode_url) == (0, 0)


def test_an_early_leg_receives_the_prompt_and_leaves_no_kv_held(push_stack, early, client):
    client.post(early.url + "/v1/completions", json=completion_body(unique_prompt(20)))  # the source is known
    used = early_outcomes(early.url)["used"]
    assert_received_not_computed(client, early.url, push_stack.decode_url)
    assert early_outcomes(early.url)["used"] == used + 1
    assert harness.wait_idle(push_stack.prefill_url) == (0, 0)
    assert harness.wait_idle(push_stack.decode_url) == (0, 0)


BUSY_PROMPTS = 24  # about 45,000 tokens, 90 steps of 512: seconds of prefill on a 2-core CPU, still past 0.3 s on one several times as fast


async def behind_a_busy_prefill_worker(stack, send):
    """`send()` once the prefill worker holds most of `BUSY_PROMPTS` long prompts of its own
    (sent to it directly, no KV kept) running or waiting, so the leg it sends waits in that
    worker's queue. The premise is checked, not assumed: a worker that got through the burst
    before it was seen busy fails here rather than in the caller's timing."""
    async with httpx.AsyncClient(timeout=120) as http:
        body = {**completion_body(unique_prompt(450)), "max_tokens": 1}  # about 1,900 tokens each
        direct = [
            asyncio.ensure_future(http.post(stack.prefill_url + "/v1/completions", json=body))
            for _ in range(BUSY_PROMPTS)
        ]
        while not all(leg.done() for leg in direct):
            busy = (await asyncio.to_thread(harness.gauges, stack.prefill_url))[0] or 0
            if busy >= BUSY_PROMPTS - 2:
                break
            await asyncio.sleep(0.01)  # poll interval
        assert not all(leg.done() for leg in direct), "the prefill worker was never seen busy"
        try:
            return await send()
        finally:
            await asyncio.gather(*direct)


@contextlib.contextmanager
def prefill_steps_paused(stack):
    """The prefill worker runs no step inside this block (its test hook,
    `pause_steps_file`): a leg it scheduled stays mid-prefill, however fast the machine."""
    pause = pause_steps_file(stack.run_dir, "prefill")
    pause.touch()
    try:
        yield
    finally:
        pause.unlink(missing_ok=True)


def test_a_client_leaving_during_an_early_prefill_leaves_no_blocks_held(push_stack, early, client):
    """The decode worker registered the prompt's blocks before the prefill ended, and vLLM
    frees them only once that prefill WRITEs them: the prefill must run to its end."""
    client.post(early.url + "/v1/completions", json=completion_body(unique_prompt(20)))
    gone = early_outcomes(early.url).get("client_gone", 0)
    with prefill_steps_paused(push_stack):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(early.url + "/v1/completions", json=completion_body(unique_prompt(40)), timeout=0.3)
        assert harness.wait_for(lambda: early_outcomes(early.url).get("client_gone", 0) == gone + 1)
    assert harness.wait_idle(push_stack.prefill_url) == (0, 0)
    assert harness.wait_idle(push_stack.decode_url) == (0, 0)


def test_a_timed_out_early_prefill_is_completed_and_leaves_no_blocks_held(push_stack, client):
    """The prefill leg times out behind other work (the proxy drops it, vLLM aborts it):
    the decode worker's registered blocks wait for a prefill of that request id, which the
    proxy sends again to the same worker. The request itself is served by the fallback."""
    proxy = early_proxy(
        push_stack,
        EARLY_FAULT_PORT,
        worker_client={"prefill_timeout_s": 0.3},
        retries={"prefill_failure_policy": "fallback"},
    )
    try:
        assert client.post(proxy.url + "/v1/completions", json=completion_body(unique_prompt(5))).status_code == 200

        async def request():
            async with httpx.AsyncClient(timeout=120) as http:
                return (
                    await http.post(proxy.url + "/v1/completions", json=completion_body(unique_prompt(40)))
                ).status_code

        assert asyncio.run(behind_a_busy_prefill_worker(push_stack, request)) == 200
        assert harness.wait_for(lambda: early_outcomes(proxy.url).get("completed", 0) == 1, timeout_s=60)
        outcomes = early_outcomes(proxy.url)
        assert outcomes["prefill_failed"] == 1 and outcomes.get("not_completed", 0) == 0
        assert harness.wait_idle(push_stack.prefill_url) == (0, 0)
        assert harness.wait_idle(push_stack.decode_url) == (0, 0)
    finally:
        proxy.stop()
