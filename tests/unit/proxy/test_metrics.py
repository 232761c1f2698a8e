"""The proxy's hand-off histogram and queue gauge, against stand-in workers (the
dashboard's hand-off and queue panels read them; tests/e2e/test_observability.py reads
them from a real stack)."""

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
    with Cluster(prefill_failure_policy="fallback", prefill_retries=0) as c:
        c.p1.prefill_status = c.p2.prefill_status = 500
        assert httpx.post(c.url + "/v1/completions", json=BODY, timeout=10).status_code == 200
        metrics = httpx.get(c.url + "/metrics").text
    assert sample(metrics, 'pdspec_proxy_leg_seconds_count{leg="handoff"}') == 0


def test_queued_gauge_counts_requests_waiting_for_a_slot():
    with Cluster(max_inflight=1, max_queue=4) as c:
        c.d.delay_s = 3.0
        threads = [threading.Thread(target=httpx.post, args=(c.url + "/v1/completions",),
                                    kwargs={"json": BODY, "timeout": 20}) for _ in range(3)]  # fmt: skip
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
