"""Proxy logic against stand-in workers: the legs, the hand-off, errors, streaming."""

import json

import httpx
import pytest

from pdspec.settings import ProxySettings
from proxy.app import create_app
from tests.standin import StandinBehaviour, ThreadServer, create_standin


@pytest.fixture
def behaviour():
    return StandinBehaviour()


@pytest.fixture
def proxy_url(behaviour):
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(prefill_urls=[worker.url], decode_urls=[worker.url], prefill_timeout_s=5)
        with ThreadServer(create_app(settings)) as proxy:
            yield proxy.url


BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}


def test_prefill_then_decode_with_the_returned_kv_params(proxy_url, behaviour):
    response = httpx.post(proxy_url + "/v1/completions", json=BODY)
    assert response.status_code == 200
    prefill, decode = behaviour.received
    assert prefill["max_tokens"] == 1 and prefill["stream"] is False
    assert decode["max_tokens"] == 5
    assert decode["kv_transfer_params"] == {
        "remote_engine_id": "standin", "remote_block_ids": [[1]], "remote_host": "127.0.0.1", "remote_port": 5600,
    }  # fmt: skip
    assert "standin" in response.json()["choices"][0]["text"]


def test_one_request_id_on_both_legs_and_in_the_response(proxy_url, behaviour):
    response = httpx.post(proxy_url + "/v1/completions", json=BODY)
    rid = response.headers["x-request-id"]
    assert len(rid) >= 16
    assert [h["x-request-id"] for h in behaviour.headers] == [rid, rid]


def test_incoming_request_id_is_honoured(proxy_url, behaviour):
    response = httpx.post(proxy_url + "/v1/completions", json=BODY, headers={"X-Request-Id": "abc-1"})
    assert response.headers["x-request-id"] == "abc-1"
    assert [h["x-request-id"] for h in behaviour.headers] == ["abc-1", "abc-1"]


def test_streaming_is_event_stream_and_complete(proxy_url):
    with httpx.stream("POST", proxy_url + "/v1/completions", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert len(lines) > 2


def test_worker_4xx_passes_through_with_its_body(proxy_url, behaviour):
    behaviour.prefill_status = 404
    response = httpx.post(proxy_url + "/v1/completions", json=BODY)
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "stand-in 404"
    assert len(behaviour.received) == 1  # no decode leg after a failed prefill


def test_prefill_5xx_becomes_502_in_openai_format(proxy_url, behaviour):
    behaviour.prefill_status = 500
    response = httpx.post(proxy_url + "/v1/completions", json=BODY)
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "server_error"


def test_missing_kv_transfer_params_is_an_error_not_a_silent_recompute(proxy_url, behaviour):
    behaviour.omit_kv_params = True
    response = httpx.post(proxy_url + "/v1/completions", json=BODY)
    assert response.status_code == 502
    assert "kv_transfer_params" in response.json()["error"]["message"]


def test_decode_status_is_checked_before_streaming_starts(proxy_url, behaviour):
    behaviour.decode_status = 400
    response = httpx.post(proxy_url + "/v1/completions", json={**BODY, "stream": True})
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")


def test_stream_broken_mid_way_ends_with_an_sse_error_event(proxy_url, behaviour):
    behaviour.break_stream_after = 2
    with httpx.stream("POST", proxy_url + "/v1/completions", json={**BODY, "stream": True}, timeout=10) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "error" in json.loads(events[-2])


def test_unreachable_worker_is_a_clean_503_and_not_ready():
    settings = ProxySettings(prefill_urls=["http://127.0.0.1:9"], decode_urls=["http://127.0.0.1:9"])
    with ThreadServer(create_app(settings)) as proxy:
        response = httpx.post(proxy.url + "/v1/completions", json=BODY)
        ready = httpx.get(proxy.url + "/ready")
    assert response.status_code == 503
    assert "no healthy prefill worker" in response.json()["error"]["message"]
    assert ready.status_code == 503


def test_oversized_body_is_413(behaviour):
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(prefill_urls=[worker.url], decode_urls=[worker.url], max_body_bytes=1000)
        with ThreadServer(create_app(settings)) as proxy:
            response = httpx.post(proxy.url + "/v1/completions", json={**BODY, "prompt": "x" * 2000})
    assert response.status_code == 413
    assert behaviour.received == []


def test_proxy_metrics_count_requests(proxy_url):
    httpx.post(proxy_url + "/v1/completions", json=BODY)
    httpx.post(proxy_url + "/v1/completions", content=b"{")
    text = httpx.get(proxy_url + "/metrics").text
    assert 'pdspec_proxy_requests_total{endpoint="completions",status="200"} 1.0' in text
    assert 'pdspec_proxy_requests_total{endpoint="completions",status="400"} 1.0' in text


def decode_legs(behaviour):
    return [b for b in behaviour.received if not (b.get("kv_transfer_params") or {}).get("do_remote_decode")]


def test_n_choices_are_separate_prefills_and_decodes_merged(proxy_url, behaviour):
    response = httpx.post(proxy_url + "/v1/completions", json={**BODY, "n": 3, "temperature": 0.7, "seed": 5})
    assert response.status_code == 200
    assert [c["index"] for c in response.json()["choices"]] == [0, 1, 2]
    assert sorted(b["seed"] for b in decode_legs(behaviour)) == [5, 6, 7]  # as vLLM seeds its children
    assert all(b["n"] == 1 for b in behaviour.received) and len(behaviour.received) == 6
    rid = response.headers["x-request-id"]
    assert sorted({h["x-request-id"] for h in behaviour.headers}) == [f"{rid}-{i}" for i in range(3)]


def test_n_choices_stream_interleaved_with_one_done(proxy_url, behaviour):
    body = {**BODY, "n": 2, "temperature": 0.7, "stream": True}
    with httpx.stream("POST", proxy_url + "/v1/completions", json=body) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    indices = {c["index"] for e in events[:-1] for c in json.loads(e)["choices"]}
    assert indices == {0, 1}
    texts = ["".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"] if c["index"] == i)
             for i in (0, 1)]  # fmt: skip
    assert all(t.startswith("decoded with") for t in texts)


def test_n_beyond_the_limit_or_greedy_is_refused(proxy_url, behaviour):
    too_many = httpx.post(proxy_url + "/v1/completions", json={**BODY, "n": 65, "temperature": 1})
    greedy = httpx.post(proxy_url + "/v1/completions", json={**BODY, "n": 2, "temperature": 0})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"
    assert greedy.status_code == 400 and "greedy" in greedy.json()["error"]["message"]
    assert behaviour.received == []
