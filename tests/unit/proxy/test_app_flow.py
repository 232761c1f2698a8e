"""Proxy logic against stand-in workers: the legs, the hand-off, errors, streaming."""

import json

import httpx
import pytest

from pdspec.settings import ProxySettings
from tests.standin import StandinBehaviour, ThreadServer, create_standin, decode_legs, proxy_server


@pytest.fixture
def behaviour():
    return StandinBehaviour()


@pytest.fixture
def proxy_url(behaviour):
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(
            prefill_urls=[worker.url], decode_urls=[worker.url], worker_client={"prefill_timeout_s": 5}
        )
        with proxy_server(settings) as proxy:
            yield proxy.url


BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}


def test_prefill_then_decode_with_the_returned_kv_params(proxy_url, behaviour):
    response = httpx.post(proxy_url + "/v1/completions", json=BODY)
    assert response.status_code == 200
    prefill, decode = behaviour.received
    assert prefill["max_tokens"] == 1 and prefill["stream"] is False
    assert decode["max_tokens"] == 5
    assert decode["kv_transfer_params"] == {
        "remote_engine_id": "standin",
        "remote_block_ids": [[1]],
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "remote_request_id": response.headers["x-request-id"],
    }
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
    with proxy_server(settings) as proxy:
        response = httpx.post(proxy.url + "/v1/completions", json=BODY)
        ready = httpx.get(proxy.url + "/ready")
    assert response.status_code == 503
    assert "no healthy prefill worker" in response.json()["error"]["message"]
    assert ready.status_code == 503


def test_oversized_body_is_413(behaviour):
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(prefill_urls=[worker.url], decode_urls=[worker.url], clients={"max_body_bytes": 1000})
        with proxy_server(settings) as proxy:
            response = httpx.post(proxy.url + "/v1/completions", json={**BODY, "prompt": "x" * 2000})
    assert response.status_code == 413
    assert behaviour.received == []


def test_proxy_metrics_count_requests(proxy_url):
    httpx.post(proxy_url + "/v1/completions", json=BODY)
    httpx.post(proxy_url + "/v1/completions", content=b"{")
    text = httpx.get(proxy_url + "/metrics").text
    assert 'pdspec_proxy_requests_total{endpoint="completions",status="200"} 1.0' in text
    assert 'pdspec_proxy_requests_total{endpoint="completions",status="400"} 1.0' in text


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
    texts = [
        "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"] if c["index"] == i) for i in (0, 1)
    ]
    assert all(t.startswith("decoded with") for t in texts)


def test_n_beyond_the_limit_or_greedy_is_refused(proxy_url, behaviour):
    too_many = httpx.post(proxy_url + "/v1/completions", json={**BODY, "n": 65, "temperature": 1})
    greedy = httpx.post(proxy_url + "/v1/completions", json={**BODY, "n": 2, "temperature": 0})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"
    assert greedy.status_code == 400 and "greedy" in greedy.json()["error"]["message"]
    assert behaviour.received == []


def test_each_prompt_of_a_list_gets_its_own_prefill_and_kv_params(proxy_url, behaviour):
    """vLLM's prefill of a list of prompts returns the first prompt's kv_transfer_params
    only: each prompt is its own prefill + decode, with its own params (issue 24, item 1)."""
    body = {**BODY, "prompt": ["first", "second", "third"]}
    response = httpx.post(proxy_url + "/v1/completions", json=body)
    assert response.status_code == 200
    prefills = [b for b in behaviour.received if b["kv_transfer_params"].get("do_remote_decode")]
    decodes = [b for b in behaviour.received if not b["kv_transfer_params"].get("do_remote_decode")]
    assert sorted(p["prompt"] for p in prefills) == ["first", "second", "third"]
    by_prompt = {d["prompt"]: d["kv_transfer_params"]["remote_request_id"] for d in decodes}
    rid = response.headers["x-request-id"]
    assert by_prompt == {"first": f"{rid}-0", "second": f"{rid}-1", "third": f"{rid}-2"}
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert [f"{rid}-{i}" in c["text"] for i, c in enumerate(choices)] == [True] * 3


def test_a_list_of_prompts_streams_each_choice_under_its_index(proxy_url):
    body = {**BODY, "prompt": [[1, 2], [3, 4]], "n": 2, "temperature": 1, "stream": True}
    with httpx.stream("POST", proxy_url + "/v1/completions", json=body) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events.count("[DONE]") == 1
    assert {c["index"] for e in events[:-1] for c in json.loads(e)["choices"]} == {0, 1, 2, 3}


def test_the_largest_seed_with_n_is_served(proxy_url, behaviour):
    """Choice j gets seed + j wrapped into int64 (issue 24, item 8), never a seed the
    worker refuses."""
    body = {**BODY, "n": 2, "temperature": 1, "seed": 2**63 - 1}
    response = httpx.post(proxy_url + "/v1/completions", json=body)
    assert response.status_code == 200, response.text
    seeds = sorted(b["seed"] for b in behaviour.received if "seed" in b)
    assert seeds == [-(2**63), 2**63 - 1]


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx"],
)
def test_only_json_bodies_are_taken(proxy_url, behaviour, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    response = httpx.post(proxy_url + "/v1/completions", content=json.dumps(BODY), headers=headers)
    assert response.status_code == 400
    assert "Only 'application/json' is allowed" in response.json()["error"]["message"]
    assert behaviour.received == []


def test_json_with_a_charset_is_taken(proxy_url):
    headers = {"content-type": "application/json; charset=utf-8"}
    assert httpx.post(proxy_url + "/v1/completions", content=json.dumps(BODY), headers=headers).status_code == 200


@pytest.mark.parametrize("depth", [254, 600, 1023])
def test_deeply_nested_json_is_a_400_not_a_500(proxy_url, behaviour, depth):
    nested = "[" * depth + "]" * depth
    raw = '{"model": "m", "prompt": "x", "extra": ' + nested + "}"
    response = httpx.post(proxy_url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "nested" in response.json()["error"]["message"]
    assert behaviour.received == []


def test_nesting_within_the_limit_passes_through(proxy_url, behaviour):
    nested = {"a": [{"b": [1]}]}
    assert httpx.post(proxy_url + "/v1/completions", json={**BODY, "extra": nested}).status_code == 200
    assert behaviour.received[-1]["extra"] == nested


def assert_served_decode_only(proxy_url, behaviour, extra, reason):
    response = httpx.post(proxy_url + "/v1/completions", json={**BODY, **extra})
    assert response.status_code == 200, response.text
    (leg,) = behaviour.received  # no prefill leg, and beam search's n is not split
    assert leg["kv_transfer_params"] is None
    assert leg.get("n", 1) == extra.get("n", 1)
    metrics = httpx.get(proxy_url + "/metrics").text
    assert f'pdspec_proxy_decode_only_total{{reason="{reason}"}} 1.0' in metrics


def test_beam_search_is_served_decode_only_and_counted(proxy_url, behaviour):
    assert_served_decode_only(proxy_url, behaviour, {"use_beam_search": True, "n": 2}, "beam_search")


STRUCTURED = [{"response_format": {"type": "json_object"}}, {"structured_outputs": {"regex": "[a-z]+"}}]


@pytest.mark.parametrize("extra", STRUCTURED)
def test_structured_outputs_go_through_pd_by_default(proxy_url, behaviour, extra):
    response = httpx.post(proxy_url + "/v1/completions", json={**BODY, **extra})
    assert response.status_code == 200, response.text
    prefill, decode = behaviour.received
    assert prefill["max_tokens"] == 1 and decode["kv_transfer_params"]["remote_engine_id"] == "standin"
    assert {key: prefill[key] for key in extra} == {key: decode[key] for key in extra} == extra  # both legs constrained
    assert 'pdspec_proxy_decode_only_total{reason="structured_output"} 0.0' in httpx.get(proxy_url + "/metrics").text


@pytest.mark.parametrize("extra", STRUCTURED)
def test_structured_outputs_decode_only_setting(behaviour, extra):
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(
            prefill_urls=[worker.url], decode_urls=[worker.url], routing={"structured_outputs": "decode_only"}
        )
        with proxy_server(settings) as proxy:
            assert_served_decode_only(proxy.url, behaviour, extra, "structured_output")


def test_lax_values_are_forwarded_as_vllm_reads_them(proxy_url, behaviour):
    response = httpx.post(proxy_url + "/v1/completions", json={**BODY, "max_tokens": 4.0, "logprobs": True})
    assert response.status_code == 200
    decode = behaviour.received[-1]
    assert decode["max_tokens"] == 4 and isinstance(decode["max_tokens"], int)
    assert decode["logprobs"] == 1
