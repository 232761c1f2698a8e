"""What a request leaves behind when its client goes or a leg fails, against stand-in
workers: every leg of every choice closed, every in-flight count back to zero, and
prefilled KV released. (tests/e2e/test_faults.py checks the same on real workers.)"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.proxy_cluster import Cluster

STREAMED_N2 = {"model": "m", "prompt": "hello", "max_tokens": 5, "n": 2, "temperature": 1.0, "stream": True}


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)  # poll interval
    return condition()


def outstanding(cluster: Cluster) -> list[int]:
    return [w.outstanding for pool in cluster.app.state.pools for w in pool.workers]


def test_client_leaving_n2_stream_while_one_choice_decodes_closes_every_leg():
    """Choice 0 is prefilled at once and its decode stream begins; choice 1's prefill
    worker is slow, so the merged reply has not started when the client leaves. Both
    legs in flight must end: the decode stream's connection closes (vLLM aborts it) and
    the slow prefill is cancelled."""
    with Cluster(prefill_policy="round_robin") as c:
        c.p2.delay_s = 30.0
        c.d.stream_event_delay_s = 1.0  # a long generation
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(c.url + "/v1/completions", json=STREAMED_N2, timeout=1.0)
        assert wait_for(lambda: c.d.streams_abandoned == 1 and c.p2.cancelled == 1)
        assert wait_for(lambda: outstanding(c) == [0, 0, 0]), outstanding(c)
        metrics = httpx.get(c.url + "/metrics").text
    assert 'pdspec_proxy_requests_total{endpoint="completions",status="499"} 1.0' in metrics


def test_client_leaving_a_merged_stream_closes_every_choice_without_counting_errors():
    with Cluster(prefill_policy="round_robin") as c:
        c.d.stream_event_delay_s = 1.0
        with httpx.stream("POST", c.url + "/v1/completions", json=STREAMED_N2, timeout=30) as response:
            assert response.status_code == 200
            next(response.iter_lines())
        assert wait_for(lambda: c.d.streams_abandoned == 2)
        assert wait_for(lambda: outstanding(c) == [0, 0, 0]), outstanding(c)
        metrics = httpx.get(c.url + "/metrics").text
    assert "pdspec_proxy_stream_errors_total 0.0" in metrics
    assert "pdspec_proxy_leg_failures_total{" not in metrics


BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}


def releases(url: str) -> dict[tuple[str, str], float]:
    """pdspec_proxy_kv_releases_total as {(reason, outcome): count}."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "pdspec_proxy_kv_releases_total":
                out[(sample.labels["reason"], sample.labels["outcome"])] = sample.value
    return out


def decode_legs(behaviour) -> list[dict]:
    return [b for b in behaviour.received if not (b.get("kv_transfer_params") or {}).get("do_remote_decode")]


def assert_released(decode: list[dict]) -> None:
    """The last decode leg is the release of the one before: same KV params, one token."""
    refused, release = decode[-2], decode[-1]
    assert release["kv_transfer_params"] == refused["kv_transfer_params"] is not None
    assert release["max_tokens"] == 1 and release["stream"] is False


@pytest.mark.parametrize("status, reason", [(400, "http_4xx"), (503, "http_5xx")])
def test_decode_refused_after_a_good_prefill_releases_the_kv(status, reason):
    with Cluster(decode_retries=0) as c:
        c.d.fail_decodes, c.d.fail_status = 1, status
        response = httpx.post(c.url + "/v1/completions", json=BODY)
        assert response.status_code == (status if status < 500 else 502)
        assert wait_for(lambda: releases(c.url) == {(reason, "ok"): 1.0}), releases(c.url)
    assert_released(decode_legs(c.d))


def test_decode_timeout_releases_the_kv():
    with Cluster(decode_retries=0, decode_timeout_s=0.5) as c:
        c.d.delay_s = 2.0  # longer than the decode leg may take (the release times out too)
        assert httpx.post(c.url + "/v1/completions", json=BODY).status_code == 504
        assert wait_for(lambda: releases(c.url) == {("timeout", "timeout"): 1.0}), releases(c.url)
    assert_released(decode_legs(c.d))


def test_no_healthy_decode_worker_sends_the_release_to_an_ejected_one():
    """An ejected decode worker may still be up; it is the only one that can free the KV."""
    with Cluster(decode_retries=0, health_interval_s=0.05, eject_after_failures=1) as c:
        c.d.healthy = False
        assert wait_for(lambda: httpx.get(c.url + "/ready").status_code == 503)
        response = httpx.post(c.url + "/v1/completions", json=BODY)
        assert response.status_code == 503
        assert wait_for(lambda: releases(c.url) == {("no_healthy_worker", "ok"): 1.0}), releases(c.url)
    (release,) = decode_legs(c.d)
    assert release["max_tokens"] == 1 and release["kv_transfer_params"]["remote_engine_id"] == "standin"


def test_unreachable_decode_worker_still_gets_a_release_attempt_counted():
    with Cluster(decode_retries=0, health_interval_s=60) as c:
        c.servers[2].__exit__(None, None, None)  # the decode worker is gone
        assert httpx.post(c.url + "/v1/completions", json=BODY).status_code == 502
        assert wait_for(lambda: releases(c.url) == {("connect_error", "connect_error"): 1.0}), releases(c.url)


def test_stream_broken_before_its_first_event_releases_the_kv():
    """Headers were sent, but the decode worker broke before any event: it may never
    have read the KV."""
    with Cluster(decode_retries=0) as c:
        c.d.break_stream_after = 0
        with httpx.stream("POST", c.url + "/v1/completions", json={**BODY, "stream": True}) as response:
            body = response.read()
        assert b'"error"' in body
        assert wait_for(lambda: sum(releases(c.url).values()) == 1), releases(c.url)
    assert_released(decode_legs(c.d))


def test_a_good_request_sends_no_release():
    with Cluster() as c:
        assert httpx.post(c.url + "/v1/completions", json=BODY).status_code == 200
        with httpx.stream("POST", c.url + "/v1/completions", json={**BODY, "stream": True}) as response:
            response.read()
        metrics = httpx.get(c.url + "/metrics").text
    assert "pdspec_proxy_kv_releases_total{" not in metrics
    assert len(decode_legs(c.d)) == 2


def prefill_legs(behaviour) -> list[dict]:
    return [b for b in behaviour.received if (b.get("kv_transfer_params") or {}).get("do_remote_decode")]


def test_client_leaving_while_queued_gives_up_its_place_and_sends_no_prefill():
    with Cluster(max_inflight=1, max_queue=4) as c:
        c.d.delay_s = 2.0  # the first request holds the only slot this long
        first = {}
        thread = threading.Thread(
            target=lambda: first.update(status=httpx.post(c.url + "/v1/completions", json=BODY, timeout=30).status_code)
        )
        thread.start()
        assert wait_for(lambda: len(decode_legs(c.d)) == 1)  # the first request is decoding
        with pytest.raises(httpx.ReadTimeout):  # queued behind it, then gone
            httpx.post(c.url + "/v1/completions", json={**BODY, "prompt": "queued"}, timeout=0.5)
        assert wait_for(lambda: c.app.state.admission.waiting == 0)
        thread.join()
        c.d.delay_s = 0.0
        assert httpx.post(c.url + "/v1/completions", json={**BODY, "prompt": "later"}, timeout=30).status_code == 200
        metrics = httpx.get(c.url + "/metrics").text
    assert first["status"] == 200
    assert [leg["prompt"] for leg in prefill_legs(c.p1) + prefill_legs(c.p2)] == ["hello", "later"]
    assert 'pdspec_proxy_requests_total{endpoint="completions",status="499"} 1.0' in metrics


def test_worker_inflight_is_exported():
    with Cluster() as c:
        c.d.delay_s = 2.0
        thread = threading.Thread(target=lambda: httpx.post(c.url + "/v1/completions", json=BODY, timeout=30))
        thread.start()
        assert wait_for(lambda: len(c.d.received) == 1)
        during = httpx.get(c.url + "/metrics").text
        thread.join()
        after = httpx.get(c.url + "/metrics").text
    decode = f'pdspec_proxy_worker_inflight{{pool="decode",worker="{c.servers[2].url}"}}'
    assert f"{decode} 1.0" in during and f"{decode} 0.0" in after

