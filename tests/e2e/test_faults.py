"""Faults with real workers: two prefill workers and one decode worker, behind two
proxies: one with only the first prefill worker and `error` policy, one with both and
`retry`. Prefix-cache reporting and client disconnects first (nothing is broken), then
the first prefill worker is killed under load, then the decode worker is killed
mid-stream."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests import fleet, harness
from tests.prompts import completion_body, unique_prompt
from tests.standin import StandinBehaviour, ThreadServer, create_standin

# After every test of the shared stack (which is stopped by then): three more workers
# beside it would crowd two cores.
pytestmark = pytest.mark.after_stack

BASE = 19000  # this module's proxies, 19000-19004; the workers are the shared fleet's (tests/fleet.py)
KV_SOURCE_PORTS = [f"{fleet.BASE + 301}-{fleet.BASE + 302}"]  # the prefill workers' NIXL side channels
CLIENT_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def cluster(fleet_2p1d, tmp_path_factory):
    """The shared 2P1D fleet (tests/fleet.py; its KV lease of 20 s is this module's: the
    refused-decode test waits for it) behind two proxies. This module is the fleet's last
    user: it kills workers, so the fleet is stopped when the module ends."""
    run = tmp_path_factory.mktemp("faults")
    p1, p2, d = (fleet_2p1d[name] for name in ("p1", "p2", "d"))
    common = {
        "decode_urls": [d.url],
        "health": {"interval_s": 0.5},
        "worker_client": {"prefill_timeout_s": 30, "decode_timeout_s": 60},
        "kv_transfer": {"source_ports": KV_SOURCE_PORTS},
    }
    single = harness.start_proxy(
        BASE, run / "single.log", prefill_urls=[p1.url], **common, retries={"prefill_failure_policy": "error"}
    )
    double = harness.start_proxy(
        BASE + 1,
        run / "double.log",
        prefill_urls=[p1.url, p2.url],
        **common,
        retries={"prefill_failure_policy": "retry"},
        routing={"prefill_policy": "round_robin"},
    )
    try:
        for proxy in (single, double):
            harness.wait_healthy(proxy.url, proxy.process, path="/ready")
        yield {"p1": p1, "p2": p2, "d": d, "single": single, "double": double, "run": run}
    finally:
        for server in (single, double):
            server.stop()
        fleet_2p1d.stop()


async def stream_then_vanish(url: str, body: dict) -> None:
    """A streaming client that goes away as soon as the first event arrives: the
    decode worker is running the request and has pulled its KV from the prefill worker."""
    first_event = asyncio.Event()

    async def read():
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", url + "/v1/completions", json=body) as response:
                async for _ in response.aiter_bytes():
                    first_event.set()

    task = asyncio.create_task(read())
    await asyncio.wait_for(first_event.wait(), 60)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_prefix_cache_hits_are_reported_from_the_prefill_worker(cluster, client):
    """These workers cache prefixes. A prompt the prefill worker has seen (sent to it
    directly) but the decode worker has not: the prefill worker serves it from its
    cache, and the client must see that hit, block-aligned."""
    body = completion_body(unique_prompt(150))
    warm = client.post(cluster["p1"].url + "/v1/completions", json={**body, "max_tokens": 1})
    assert warm.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    reply = client.post(cluster["single"].url + "/v1/completions", json=body).json()
    cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < reply["usage"]["prompt_tokens"] and cached % 16 == 0


def test_messages_cache_creation_is_the_prefill_workers(cluster, client):
    """A Messages prompt nobody has seen: the prefill worker computes and caches its whole
    blocks, as a colocated vLLM reports in `cache_creation_input_tokens`; the decode worker
    pulled them and created none (the proxy passed its 0 on before issue 39)."""
    body = {
        "model": "pdspec-tiny",
        "max_tokens": 3,
        "temperature": 0,
        "messages": [{"role": "user", "content": unique_prompt(150)}],
    }
    usage = client.post(cluster["single"].url + "/v1/messages", json=body).json()["usage"]
    created = usage["cache_creation_input_tokens"]
    assert created > 0 and created % 16 == 0, usage
    # The decode worker now holds the prompt (pulled): served alone it reads it all from
    # its cache, so the prompt's size is known from the same request.
    direct = client.post(cluster["d"].url + "/v1/messages", json=body).json()["usage"]
    total = direct["input_tokens"] + direct["cache_read_input_tokens"] + direct["cache_creation_input_tokens"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] + created == total


def test_client_disconnect_mid_stream_frees_both_workers(cluster):
    body = completion_body(unique_prompt(60), stream=True, max_tokens=1000)
    asyncio.run(stream_then_vanish(cluster["single"].url, body))
    for worker in ("p1", "d"):
        assert harness.wait_idle(cluster[worker].url) == (0, 0), worker


def proxy_counts(url: str) -> dict:
    return {
        "prefilled": sum(v for k, v in harness.scrape_labeled(url, "pdspec_proxy_prefill_outcomes_total").items()),
        "gone": harness.scrape_labeled(url, "pdspec_proxy_requests_total").get(
            (("endpoint", "completions"), ("status", "499")), 0
        ),
    }


async def vanish_during_prefill(proxy_url: str, prefill_url: str) -> None:
    """Keeps the prefill worker busy with long prompts sent to it directly, sends one
    request through the proxy, and leaves as soon as the proxy has it in flight: its
    prefill leg is then queued or running behind the others."""
    long_prompt = {"model": "pdspec-tiny", "max_tokens": 1}
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
        busy = [
            asyncio.create_task(
                client.post(prefill_url + "/v1/completions", json={**long_prompt, "prompt": unique_prompt(420)})
            )
            for _ in range(4)
        ]
        target = asyncio.create_task(
            client.post(proxy_url + "/v1/completions", json=completion_body(unique_prompt(420), max_tokens=8))
        )
        while harness.scrape(proxy_url).get("pdspec_proxy_inflight_requests", 0) < 1:
            await asyncio.sleep(0.005)
        target.cancel()
        await asyncio.gather(target, return_exceptions=True)
        assert all(r.status_code == 200 for r in await asyncio.gather(*busy))


def test_client_disconnect_during_prefill_frees_the_prefill_worker(cluster):
    before = proxy_counts(cluster["single"].url)
    asyncio.run(vanish_during_prefill(cluster["single"].url, cluster["p1"].url))
    assert harness.wait_idle(cluster["p1"].url) == (0, 0)
    after = proxy_counts(cluster["single"].url)
    assert after["prefilled"] == before["prefilled"]  # the client left before its prefill finished
    assert after["gone"] == before["gone"] + 1


def test_client_gone_between_the_legs_frees_the_prefill_kv_before_its_lease_ends(cluster):
    """The prefill leg finishes on the real prefill worker; the first decode attempt goes
    to a decode worker that is gone (admitted, then stopped: nothing reaches it), and the
    client leaves during the retry backoff, so no decode worker got the request. Without
    the proxy's one-token release the prefill worker would keep the KV until its lease ends
    (20 s here, 120 s by default); with it, the real decode worker reads the KV and the prefill worker
    is idle within seconds."""
    with ThreadServer(create_standin(StandinBehaviour())) as standin:
        proxy = harness.start_proxy(
            BASE + 2,
            prefill_urls=[cluster["p1"].url],
            decode_urls=[standin.url, cluster["d"].url],
            routing={"decode_policy": "round_robin"},
            retries={"decode_retries": 1, "backoff_s": 5.0},
            health={"interval_s": 60},
            kv_transfer={"source_ports": KV_SOURCE_PORTS},
        )
        try:
            harness.wait_healthy(proxy.url, proxy.process, path="/ready")
            healthy = lambda: harness.scrape_labeled(proxy.url, "pdspec_proxy_healthy_workers")  # noqa: E731
            assert harness.wait_for(lambda: healthy().get((("pool", "decode"),)) == 2, timeout_s=30), healthy()
        finally:
            standin.__exit__(None, None, None)  # gone, but still in the pool until the next check (60 s)
        try:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(proxy.url + "/v1/completions", json=completion_body(unique_prompt(150)), timeout=3)
            failures = harness.scrape_labeled(proxy.url, "pdspec_proxy_leg_failures_total")
            assert failures == {(("leg", "decode"), ("reason", "connect_error")): 1.0}  # the gone worker first
            assert harness.wait_idle(cluster["p1"].url, timeout_s=10) == (0, 0)
            releases = harness.scrape_labeled(proxy.url, "pdspec_proxy_kv_releases_total")
            assert releases == {(("outcome", "ok"), ("reason", "client_gone")): 1.0}
        finally:
            proxy.stop()


def proxy_inflight(url: str) -> list[float]:
    """The proxy's open legs per worker (pdspec_proxy_worker_inflight)."""
    return list(harness.scrape_labeled(url, "pdspec_proxy_worker_inflight").values())


async def n_choices_then_vanish(proxy_url: str, decode_url: str) -> bool:
    """A streamed n=2 request whose client leaves once the decode worker runs one of its
    choices; returns whether the reply had begun by then."""
    body = completion_body(unique_prompt(150), stream=True, n=2, temperature=0.8, max_tokens=1500, ignore_eos=True)
    began = asyncio.Event()

    async def read():
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
            async with client.stream("POST", proxy_url + "/v1/completions", json=body) as response:
                began.set()
                async for _ in response.aiter_bytes():
                    pass

    task = asyncio.create_task(read())
    deadline = time.monotonic() + 60
    while not (await asyncio.to_thread(harness.scrape, decode_url)).get("vllm:num_requests_running"):
        assert time.monotonic() < deadline and not task.done(), "no choice reached the decode worker"
        await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return began.is_set()


def test_client_leaving_n_choices_frees_every_leg_and_all_kv(cluster):
    """Choice 0 is prefilled by the real prefill worker and decodes on the real decode
    worker (1,500 tokens to go); choice 1's prefill worker is a stand-in that does not
    answer, so the merged reply has not begun when the client leaves. Every leg must end:
    the decode worker stops generating and frees its KV, the prefill worker's KV is
    freed, the stand-in sees its caller leave, and the proxy holds no leg on any worker
    (before the fix, choice 0's decode kept streaming to nobody and its in-flight count
    stayed raised for good)."""
    slow = StandinBehaviour(delay_s=120.0)
    with ThreadServer(create_standin(slow)) as standin:
        proxy = harness.start_proxy(
            BASE + 3,
            prefill_urls=[cluster["p1"].url, standin.url],
            decode_urls=[cluster["d"].url],
            routing={"prefill_policy": "round_robin"},
            health={"interval_s": 0.5},
            kv_transfer={"source_ports": KV_SOURCE_PORTS},
        )
        try:
            harness.wait_healthy(proxy.url, proxy.process, path="/ready")
            began = asyncio.run(n_choices_then_vanish(proxy.url, cluster["d"].url))
            assert not began  # the case of the defect: choice 1 still in its prefill
            for worker in ("d", "p1"):
                assert harness.wait_idle(cluster[worker].url, timeout_s=10) == (0, 0), worker
            assert harness.wait_for(lambda: slow.cancelled == 1, 10)
            assert harness.wait_for(lambda: proxy_inflight(proxy.url) == [0.0] * 3, 10), proxy_inflight(proxy.url)
        finally:
            proxy.stop()


def test_stream_options_without_stream_is_refused_before_the_prefill_leg(cluster, client):
    """The issue's example: the prefill leg drops stream_options, so before the fix the
    prefill worker computed the prompt, the decode worker refused the request in its
    request validation (which frees nothing), and the prompt's KV stayed on the prefill
    worker until its lease ended (30 s)."""
    before = harness.scrape(cluster["p1"].url).get("vllm:prompt_tokens_total", 0)
    body = completion_body(unique_prompt(400), stream=False, stream_options={"include_usage": True})
    response = client.post(cluster["single"].url + "/v1/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stream_options"
    assert harness.wait_idle(cluster["p1"].url, timeout_s=5) == (0, 0)
    assert harness.scrape(cluster["p1"].url).get("vllm:prompt_tokens_total", 0) == before  # no prefill


def test_a_refused_decode_leg_gets_no_second_read_and_the_lease_frees_the_kv(cluster):
    """The real prefill worker computes the prompt; the decode leg goes to a stand-in that
    answers 503 (no retries). The proxy sends no release: a vLLM decode worker that refuses
    a request has the prefill worker free its KV itself, and a second read of blocks that
    may be freed could cache another request's KV on a decode worker. This stand-in frees
    nothing, so the prefill worker's KV lease (20 s here) is what frees the KV."""
    refusing = StandinBehaviour(fail_decodes=1, fail_status=503)
    decode_requests = harness.scrape(cluster["d"].url).get("vllm:request_success_total", 0.0)
    with ThreadServer(create_standin(refusing)) as standin:
        proxy = harness.start_proxy(
            BASE + 4,
            prefill_urls=[cluster["p1"].url],
            decode_urls=[standin.url, cluster["d"].url],
            routing={"decode_policy": "round_robin"},
            retries={"decode_retries": 0},
            health={"interval_s": 0.5},
            kv_transfer={"source_ports": KV_SOURCE_PORTS},
        )
        try:
            harness.wait_healthy(proxy.url, proxy.process, path="/ready")
            response = httpx.post(proxy.url + "/v1/completions", json=completion_body(unique_prompt(400)), timeout=60)
            assert response.status_code == 502
            assert len(refusing.received) == 1 and refusing.received[0]["kv_transfer_params"]  # the refused decode
            _, usage = harness.gauges(cluster["p1"].url)
            assert usage is not None and usage > 0  # the KV is still held: nobody read it
            assert harness.wait_idle(cluster["p1"].url, timeout_s=45) == (0, 0)  # the lease ends
            assert harness.scrape_labeled(proxy.url, "pdspec_proxy_kv_releases_total") == {}
            assert harness.scrape(cluster["d"].url).get("vllm:request_success_total", 0.0) == decode_requests
        finally:
            proxy.stop()


async def fire(url: str, n: int, kill_after_s: float, kill) -> list:
    async def one(i):
        body = completion_body(unique_prompt(150), max_tokens=24)
        started = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
                response = await client.post(url + "/v1/completions", json=body)
            return response.status_code, response.json(), time.monotonic() - started
        except httpx.HTTPError as exc:
            return type(exc).__name__, None, time.monotonic() - started

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.sleep(kill_after_s)
    await asyncio.to_thread(kill)
    return await asyncio.gather(*tasks)


def test_prefill_worker_killed_under_load(cluster):
    async def both():
        # 50 requests through each proxy; kill the first prefill worker while they run.
        killed = asyncio.Event()

        def kill():
            cluster["p1"].kill()
            killed.set()

        single, double = await asyncio.gather(
            fire(cluster["single"].url, 50, 1.0, kill), fire(cluster["double"].url, 50, 1.0, lambda: None)
        )
        return single, double

    single, double = asyncio.run(both())
    # One prefill worker, `error` policy: each request completes or gets a clean 5xx, in time.
    for status, body, seconds in single:
        assert status == 200 or (isinstance(status, int) and 500 <= status < 600), (status, body)
        if status != 200:  # a worker's failure, never the proxy's own (its 500 "Internal proxy error")
            assert "error" in body and body["error"]["code"] != "internal_server_error", body
        assert seconds < CLIENT_TIMEOUT_S
    assert any(status != 200 for status, _, _ in single)  # the kill did hit requests in flight
    # Two prefill workers, `retry` policy: every request completes.
    failed = [r for r in double if r[0] != 200][:3]
    assert not failed, (failed, (cluster["run"] / "double.log").read_text(errors="replace")[-3000:])
    outcomes = harness.scrape(cluster["double"].url)
    assert outcomes.get("pdspec_proxy_prefill_outcomes_total", 0) >= 50


def test_decode_worker_killed_mid_stream_ends_with_an_sse_error(cluster):
    body = completion_body(unique_prompt(40), stream=True, max_tokens=1500)
    events = harness.stream_and_kill(cluster["double"].url, body, kill=cluster["d"].kill)
    assert events[-1] == "[DONE]"
    assert "error" in json.loads(events[-2])
