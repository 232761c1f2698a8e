"""What a request leaves behind when its client goes or a leg fails, against stand-in
workers: every leg of every choice closed, every in-flight count back to zero, prefilled
KV released where no decode worker got it, and each prefill's KV handed to one decode leg
only. (tests/e2e/test_faults.py checks the same on real workers.)"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests import harness
from tests.proxy_cluster import Cluster, Fleet, outstanding, sample
from tests.standin import decode_legs

STREAMED_N2 = {"model": "m", "prompt": "hello", "max_tokens": 5, "n": 2, "temperature": 1.0, "stream": True}


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    return harness.wait_for(condition, timeout_s, poll_s=0.02)


def test_client_leaving_n2_stream_while_one_choice_decodes_closes_every_leg():
    """Choice 0 is prefilled at once and its decode stream begins; choice 1's prefill
    worker is slow, so the merged reply has not started when the client leaves. Both
    legs in flight must end: the decode stream's connection closes (vLLM aborts it) and
    the slow prefill is cancelled."""
    with Cluster(routing={"prefill_policy": "round_robin"}) as c:
        c.p2.delay_s = 30.0
        c.d.stream_event_delay_s = 1.0  # a long generation
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(c.url + "/v1/completions", json=STREAMED_N2, timeout=1.0)
        assert wait_for(lambda: c.d.streams_abandoned == 1 and c.p2.cancelled == 1)
        assert wait_for(lambda: outstanding(c) == [0, 0, 0]), outstanding(c)
        metrics = httpx.get(c.url + "/metrics").text
    assert 'pdspec_proxy_requests_total{endpoint="completions",status="499"} 1.0' in metrics


def test_client_leaving_a_merged_stream_closes_every_choice_without_counting_errors():
    with Cluster(routing={"prefill_policy": "round_robin"}) as c:
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
        for series in family.samples:
            if series.name == "pdspec_proxy_kv_releases_total":
                out[(series.labels["reason"], series.labels["outcome"])] = series.value
    return out


def assert_one_read(decode: list[dict]) -> None:
    """Each prefill's KV params went to one decode leg only (no release, no resend)."""
    params = [json.dumps(b["kv_transfer_params"], sort_keys=True) for b in decode if b.get("kv_transfer_params")]
    assert len(params) == len(set(params)), params


@pytest.mark.parametrize("status", [400, 503])
def test_a_refused_decode_is_not_followed_by_a_second_read_of_its_kv(status):
    """vLLM's serving layer frees the KV of a request it refuses (it notifies the prefill
    worker): a release leg would read blocks that may already hold another request's KV."""
    with Cluster(retries={"decode_retries": 0}) as c:
        c.d.fail_decodes, c.d.fail_status = 1, status
        response = httpx.post(c.url + "/v1/completions", json=BODY)
        assert response.status_code == (status if status < 500 else 502)
        metrics = httpx.get(c.url + "/metrics").text
    assert len(decode_legs(c.d)) == 1
    assert "pdspec_proxy_kv_releases_total{" not in metrics


def test_a_timed_out_decode_sends_no_release():
    """The decode worker has the request (a hung one reads the KV when it resumes)."""
    with Cluster(retries={"decode_retries": 0}, worker_client={"decode_timeout_s": 0.5}) as c:
        c.d.delay_s = 2.0  # longer than the decode leg may take
        assert httpx.post(c.url + "/v1/completions", json=BODY).status_code == 504
        assert wait_for(lambda: c.d.cancelled == 1)  # it saw the proxy leave
        metrics = httpx.get(c.url + "/metrics").text
    assert len(decode_legs(c.d)) == 1
    assert "pdspec_proxy_kv_releases_total{" not in metrics


def test_a_decode_retry_after_a_handed_over_attempt_prefills_again():
    """A decode worker got the leg and failed: it may still read that KV, so the retry on
    the other decode worker carries the KV of a second prefill."""
    with Fleet(
        prefill=1, decode=2, routing={"decode_policy": "round_robin"}, retries={"decode_retries": 1, "backoff_s": 0.01}
    ) as f:
        failing, serving = f.decodes
        failing.fail_decodes = 1
        for _ in range(2):  # round robin: one of the two requests tries the failing worker first
            response = httpx.post(f.url + "/v1/completions", json=BODY)
            assert response.status_code == 200, response.text
        metrics = httpx.get(f.url + "/metrics").text
    refused = decode_legs(failing)[0]  # its first decode leg is the one it refused
    assert f.prefills[0].prefills == 3  # two requests, one prefilled again
    retried = [
        b
        for b in decode_legs(serving)
        if b["kv_transfer_params"]["remote_request_id"] == refused["kv_transfer_params"]["remote_request_id"]
    ]
    assert len(retried) == 1 and retried[0]["kv_transfer_params"] != refused["kv_transfer_params"]
    assert_one_read(decode_legs(failing) + decode_legs(serving))
    assert sample(metrics, 'pdspec_proxy_kv_reprefills_total{reason="http_5xx"}') == 1.0
    assert "pdspec_proxy_kv_releases_total{" not in metrics


def test_a_decode_retry_after_an_unreachable_worker_keeps_the_kv():
    """Nothing reached the first decode worker, so the KV is still unread: one prefill."""
    with Fleet(
        prefill=1,
        decode=2,
        routing={"decode_policy": "round_robin"},
        retries={"decode_retries": 1, "backoff_s": 0.01},
        health={"interval_s": 60},
    ) as f:
        f.servers[1].__exit__(None, None, None)  # the first decode worker is gone
        for _ in range(2):  # round robin: one of the two requests tries the gone worker first
            assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        metrics = httpx.get(f.url + "/metrics").text
    assert f.prefills[0].prefills == 2 and len(decode_legs(f.decodes[1])) == 2
    assert sample(metrics, 'pdspec_proxy_leg_failures_total{leg="decode",reason="connect_error"}') >= 1.0
    assert "pdspec_proxy_kv_reprefills_total{" not in metrics


def test_no_healthy_decode_worker_sends_the_release_to_an_ejected_one():
    """An ejected decode worker may still be up; it is the only one that can free the KV."""
    with Cluster(retries={"decode_retries": 0}, health={"interval_s": 0.05, "eject_after_failures": 1}) as c:
        c.d.healthy = False
        assert wait_for(lambda: httpx.get(c.url + "/ready").status_code == 503)
        response = httpx.post(c.url + "/v1/completions", json=BODY)
        assert response.status_code == 503
        assert wait_for(lambda: releases(c.url) == {("no_healthy_worker", "ok"): 1.0}), releases(c.url)
    (release,) = decode_legs(c.d)
    assert release["max_tokens"] == 1 and release["kv_transfer_params"]["remote_engine_id"] == "standin"


def test_unreachable_decode_worker_still_gets_a_release_attempt_counted():
    with Cluster(retries={"decode_retries": 0}, health={"interval_s": 60}) as c:
        c.servers[2].__exit__(None, None, None)  # the decode worker is gone
        assert httpx.post(c.url + "/v1/completions", json=BODY).status_code == 502
        assert wait_for(lambda: releases(c.url) == {("connect_error", "connect_error"): 1.0}), releases(c.url)


def test_stream_broken_before_its_first_event_sends_no_release():
    """Headers came from the decode worker: it had the request, and vLLM frees the KV of a
    request it aborts."""
    with Cluster(retries={"decode_retries": 0}) as c:
        c.d.break_stream_after = 0
        with httpx.stream("POST", c.url + "/v1/completions", json={**BODY, "stream": True}) as response:
            body = response.read()
        assert b'"error"' in body
        metrics = httpx.get(c.url + "/metrics").text
    assert len(decode_legs(c.d)) == 1
    assert "pdspec_proxy_kv_releases_total{" not in metrics


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
    with Cluster(admission={"max_inflight": 1, "max_queue": 4}) as c:
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
