"""The proxy's hand-off histogram, queue gauge and request counts by status, against
stand-in workers (the dashboard's panels and the alerts read them;
tests/e2e/test_observability.py reads them from a real stack)."""

import threading
import time

import httpx

from tests.proxy_cluster import BODY, Cluster, sample


def test_handoff_is_timed_from_the_prefill_reply_to_the_first_decode_byte():
    with Cluster() as c:
        c.d.delay_s = 0.3  # the decode worker's first byte comes 0.3 s after the prefill reply
        assert httpx.post(c.url + "/v1/completions", json=BODY, timeout=10).status_code == 200
        c.d.delay_s = 0
        assert httpx.post(c.url + "/v1/completions", json={**BODY, "stream": True}, timeout=10).status_code == 200
        metrics = httpx.get(c.url + "/metrics").text
    assert sample(metrics, 'pdspec_proxy_leg_seconds_count{leg="handoff"}') == 2
    assert 0.3 <= sample(metrics, 'pdspec_proxy_leg_seconds_sum{leg="handoff"}') < 5


def test_fallback_requests_have_no_handoff():
    with Cluster(retries={"prefill_failure_policy": "fallback", "prefill_retries": 0}) as c:
        c.p1.prefill_status = c.p2.prefill_status = 500
        assert httpx.post(c.url + "/v1/completions", json=BODY, timeout=10).status_code == 200
        metrics = httpx.get(c.url + "/metrics").text
    assert sample(metrics, 'pdspec_proxy_leg_seconds_count{leg="handoff"}') == 0


def test_queued_gauge_counts_requests_waiting_for_a_slot():
    with Cluster(admission={"max_inflight": 1, "max_queue": 4}) as c:
        c.d.delay_s = 3.0
        threads = [
            threading.Thread(target=httpx.post, args=(c.url + "/v1/completions",), kwargs={"json": BODY, "timeout": 20})
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 2.5  # within the 3 s the first request holds the only slot
        queued = 0.0
        while queued < 2 and time.monotonic() < deadline:  # two wait behind the one that holds it
            queued = sample(httpx.get(c.url + "/metrics").text, "pdspec_proxy_queued_requests")
        assert queued == 2
        for thread in threads:
            thread.join()
        assert sample(httpx.get(c.url + "/metrics").text, "pdspec_proxy_queued_requests") == 0


def test_every_endpoint_exports_its_500_count_at_zero_from_the_start():
    """Alert PdspecProxyInternalError takes `increase` of it: a series born at 1 would never fire."""
    with Cluster() as c:
        metrics = httpx.get(c.url + "/metrics").text
    for endpoint in ("completions", "chat", "responses", "messages"):
        assert sample(metrics, f'pdspec_proxy_requests_total{{endpoint="{endpoint}",status="500"}}') == 0


async def test_a_request_cancelled_by_the_proxys_own_shutdown_counts_503_not_500():
    """uvicorn cancels the requests still running when its graceful shutdown ends: not an
    "Internal proxy error" (500, alert PdspecProxyInternalError), nor a client that left (499)."""
    import asyncio
    import json

    from pdspec.settings import ClientSettings
    from proxy.admission.queue import Admission
    from proxy.apis.completions import COMPLETIONS
    from proxy.apis.limits import ModelLimits
    from proxy.auth import ApiKeys
    from proxy.edge.endpoint import OpenAIEndpoint
    from proxy.metrics import ProxyMetrics
    from proxy.tracing import Tracing

    serving = asyncio.Event()

    class Hanging:  # the legs of a request the shutdown catches mid-way
        async def serve(self, exchange):
            serving.set()
            await asyncio.Event().wait()

    limits = ModelLimits(None, None, {})
    limits.known = True
    metrics = ProxyMetrics.create()
    endpoint = OpenAIEndpoint(
        COMPLETIONS, ClientSettings(), ApiKeys([]), Admission(4, 4, 5.0, 1), limits, Hanging(), metrics, Tracing(None)
    )
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(b"content-type", b"application/json")],
    }
    messages = [{"type": "http.request", "body": json.dumps(BODY).encode(), "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays

    async def send(message):
        pass

    task = asyncio.ensure_future(endpoint(scope, receive, send))
    await asyncio.wait_for(serving.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    count = lambda status: metrics.registry.get_sample_value(  # noqa: E731
        "pdspec_proxy_requests_total", {"endpoint": "completions", "status": status}
    )
    assert count("503") == 1 and count("500") == 0 and count("499") is None


def test_the_planners_replicas_are_exported_only_when_given():
    with Cluster(observability={"plan_replicas": {"prefill": 3, "decode": 5}}) as c:
        metrics = httpx.get(c.url + "/metrics").text
    assert sample(metrics, 'pdspec_plan_replicas{role="prefill"}') == 3
    assert sample(metrics, 'pdspec_plan_replicas{role="decode"}') == 5
    with Cluster() as c:
        assert "pdspec_plan_replicas{" not in httpx.get(c.url + "/metrics").text
