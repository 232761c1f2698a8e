"""Admission by queued prefill time, with the shared stack's real workers: prompts that come
faster than the prefill worker prefills them wait in vLLM's queue, and a prefill leg's
timeout counts that wait. What the one-GPU 1P1D run on the H200 hit at the seed's load
(29 requests waiting, the prefill worker's KV 2% used, 10 of 48 requests a 504 with
admission by KV room alone: loadtest/results/one_gpu_admission/h200-seed-load/).

A burst of prompts that take the prefill worker three times a prefill leg's timeout (both
sized from one prompt's prefill time on this machine) goes through two proxies in front of
the stack's workers, one after the other: without
admission the legs at the back of the worker's queue time out (504); with
`admission.prefill_kv` (KV room and queued prefill time, at the rate the proxy measures)
they wait in the proxy instead, and every request is served. A real Prometheus scrapes
the admitting proxy meanwhile: the dashboard's admission panels (which the shared stack's
own proxy, admission off, cannot fill) have data."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time

import httpx
import pytest

from deploy.prometheus.promql import load_dashboard, panel_queries, substitute
from tests import harness
from tests.prometheus_server import PrometheusServer
from tests.prompts import completion_body, unique_prompt
from tests.standin import unused_port

PORT = 18060
WORDS = 300  # about 1,200 tokens of the local model's tokenizer
QUEUED_TIMEOUTS = 3  # the burst holds this many prefill timeouts of work


@pytest.fixture(scope="module")
def load(stack) -> tuple[float, int]:
    """(a prefill leg's timeout, the burst's size), from how long one prompt's prefill takes
    on this machine: the timeout 4 prompts' time (at least 2 s), the burst QUEUED_TIMEOUTS
    timeouts of the worker's time (a prompt of 1,200 tokens already fills vLLM's 512-token
    steps, so more at once do not go faster)."""
    seconds = []
    with httpx.Client(timeout=60) as client:
        for _ in range(3):
            started = time.perf_counter()
            reply = client.post(
                stack.prefill_url + "/v1/completions", json=completion_body(unique_prompt(WORDS), max_tokens=1)
            ).json()
            seconds.append(time.perf_counter() - started)
    assert 1000 <= reply["usage"]["prompt_tokens"] <= 1600, reply["usage"]
    one = statistics.median(seconds)
    timeout = max(2.0, 4 * one)
    return timeout, min(max(math.ceil(QUEUED_TIMEOUTS * timeout / one), 6), 48)


async def burst(url: str, size: int) -> list[int]:
    async def one(client: httpx.AsyncClient) -> int:
        body = completion_body(unique_prompt(WORDS), max_tokens=2)
        return (await client.post(url + "/v1/completions", json=body)).status_code

    async with httpx.AsyncClient(timeout=300) as client:
        return list(await asyncio.gather(*(one(client) for _ in range(size))))


def through_proxy(stack, load: tuple[float, int], port: int, while_up=None, **settings) -> tuple[list[int], dict]:
    """The burst through a proxy of `settings` on `port`; `while_up()` runs after it, before
    the proxy stops."""
    prefill_timeout_s, size = load
    assert harness.wait_idle(stack.prefill_url, timeout_s=60) == (0, 0)  # nothing left from the tests before
    proxy = harness.start_proxy(
        port,
        **harness.merged(
            {
                "prefill_urls": [stack.prefill_url],
                "decode_urls": [stack.decode_url],
                "worker_client": {"prefill_timeout_s": prefill_timeout_s},
                "admission": {"queue_timeout_s": 240},
                "kv_transfer": {"source_ports": [str(harness.STACK_BASE_PORT + 300)]},
            },
            settings,
        ),
    )
    try:
        harness.wait_healthy(proxy.url, proxy.process, path="/ready")
        statuses = asyncio.run(burst(proxy.url, size))
        names = (
            "pdspec_proxy_leg_failures_total",
            "pdspec_proxy_kv_room_waits_total",
            "pdspec_proxy_prefill_rate_tokens_per_second",
        )
        metrics = {name: harness.scrape_labeled(proxy.url, name) for name in names}
        if while_up is not None:
            while_up()
        return statuses, metrics
    finally:
        proxy.stop()
        harness.wait_idle(stack.prefill_url, timeout_s=60)  # the aborted legs gone before the next test


def test_without_admission_the_legs_at_the_back_of_the_prefill_queue_time_out(stack, load):
    statuses, metrics = through_proxy(stack, load, PORT)
    failures = metrics["pdspec_proxy_leg_failures_total"]
    assert statuses.count(504) >= 1, (load, statuses)
    assert failures.get((("leg", "prefill"), ("reason", "timeout")), 0) >= 1, failures


ADMISSION_PANELS = [
    "Prefill KV room (admission) [A]",
    "Prefill KV room (admission) [B]",
    "Prefill queue (admission) [A]",
]


def test_with_admission_the_burst_waits_in_the_proxy_and_every_request_is_served(stack, load, tmp_path_factory):
    prometheus = PrometheusServer(tmp_path_factory.mktemp("prometheus"), unused_port(18971, 18989))
    prometheus.start({"pdspec-proxy": [f"127.0.0.1:{PORT + 1}"]})  # scraped once it is up
    panels = {f"{q.name}": q for q in panel_queries(load_dashboard()) if q.name in ADMISSION_PANELS}
    empty: list[str] = []

    def panels_have_data():
        empty.extend(
            name
            for name, q in panels.items()
            if not harness.wait_for(
                lambda q=q: bool(prometheus.api.query(substitute(q.expr, "2m", "10m"))), timeout_s=60
            )
        )

    try:
        statuses, metrics = through_proxy(
            stack,
            load,
            PORT + 1,
            while_up=panels_have_data,
            admission={"prefill_kv": True, "prefill_kv_read_interval_s": 0.25},
        )
    finally:
        prometheus.stop()
    assert sorted(panels) == sorted(ADMISSION_PANELS) and not empty, f"admission panels with no data: {empty}"
    assert statuses == [200] * load[1], (load, statuses)
    assert metrics["pdspec_proxy_leg_failures_total"] == {}, json.dumps({k: str(v) for k, v in metrics.items()})
    waits = metrics["pdspec_proxy_kv_room_waits_total"]
    assert waits[(("outcome", "admitted"),)] >= 1 and waits[(("outcome", "timeout"),)] == 0, waits
    (rate,) = metrics["pdspec_proxy_prefill_rate_tokens_per_second"].values()
    assert rate > 0
