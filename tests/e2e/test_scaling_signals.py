"""The autoscalers' signals (the pdspec-scaling recording rules that
deploy/k8s/components/autoscaling-keda and -hpa read) on a real Prometheus scraping the
shared stack's workers and a proxy given a plan: the queue and KV signals rise while load
runs and fall back once it ends, the requests' TPOT p90 is recorded, and the plan's floor
under the decode workers follows the prefill workers and the plan's ratio (1 : 2)."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from tests import harness
from tests.prometheus_server import PrometheusServer
from tests.prompts import completion_body, unique_prompt
from tests.standin import unused_port

PLAN_PROXY_PORT = 18062
PLAN = {"prefill": 1, "decode": 2}
LOAD_REQUESTS, LOAD_CONCURRENCY = 48, 16


@pytest.fixture(scope="module")
def plan_proxy(stack):
    proxy = harness.start_proxy(
        PLAN_PROXY_PORT,
        prefill_urls=[stack.prefill_url],
        decode_urls=[stack.decode_url],
        observability={"plan_replicas": PLAN},
        # the stack's prefill side channel (tests/harness.py)
        kv_transfer={"source_ports": [str(harness.STACK_BASE_PORT + 300)]},
    )
    harness.wait_healthy(proxy.url, proxy.process, path="/ready")
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def prometheus(stack, plan_proxy, tmp_path_factory):
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), unused_port(18950, 18969))
    server.start_scraping(plan_proxy.url, [stack.prefill_url], [stack.decode_url])
    yield server
    server.stop()


def signal(prometheus, expr: str) -> float:
    result = prometheus.api.query(expr)
    return float(result[0]["value"][1]) if result else 0.0


def test_the_plans_floor_follows_its_ratio(prometheus):
    prometheus.wait_for("pdspec:plan_decode_floor:replicas", bool, what="the plan's floor recorded")
    assert signal(prometheus, "pdspec:plan_decode_per_prefill:ratio") == 2
    assert signal(prometheus, "pdspec:plan_decode_floor:replicas") == 2  # 1 prefill worker x 2
    assert signal(prometheus, 'role:pdspec_workers:count{role="prefill"}') == 1


def test_the_queue_and_kv_signals_rise_under_load_and_fall_after(prometheus, plan_proxy):
    waiting = 'role:vllm_num_requests_waiting:sum{role="prefill"}'
    kv_in_use = 'role:vllm_kv_cache_usage_perc:sum{role="decode"}'
    # vLLM exports these gauges from its engine's first stats on: none yet counts as idle.
    idle = lambda r: not r or float(r[0]["value"][1]) == 0  # noqa: E731
    prometheus.wait_for(kv_in_use, idle, what="no decode KV in use before the load")
    prometheus.wait_for(waiting, idle, what="no prompt waiting before the load")

    def one(i: int) -> int:
        body = completion_body(unique_prompt(400), max_tokens=64, ignore_eos=True)
        return httpx.post(plan_proxy.url + "/v1/completions", json=body, timeout=300).status_code

    peaks = {waiting: 0.0, kv_in_use: 0.0}
    with concurrent.futures.ThreadPoolExecutor(LOAD_CONCURRENCY) as pool:
        load = [pool.submit(one, i) for i in range(LOAD_REQUESTS)]
        while not all(f.done() for f in load):  # the signals, read while the load runs
            for expr in peaks:
                peaks[expr] = max(peaks[expr], signal(prometheus, expr))
            time.sleep(0.2)  # poll interval (Prometheus scrapes and evaluates every second here)
        assert [f.result() for f in load] == [200] * LOAD_REQUESTS
    assert peaks[waiting] > 0, "no prompt was seen waiting on the prefill worker under load"
    assert peaks[kv_in_use] > 0, "no decode KV was seen in use under load"
    # Once the load is over both fall back to 0 (the KV freed, nothing queued).
    freed = lambda r: r and float(r[0]["value"][1]) == 0  # noqa: E731
    prometheus.wait_for(kv_in_use, freed, what="decode KV freed")
    prometheus.wait_for(waiting, freed, what="prefill queue empty")
    tpot = signal(prometheus, 'role:vllm_request_time_per_output_token_seconds:p90_2m{role="decode"}')
    assert 0 < tpot < 5  # the TPOT p90 of the requests the load ended, in seconds
