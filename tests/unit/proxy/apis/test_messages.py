"""`POST /v1/messages` (Anthropic) through P/D against stand-in workers that answer as
vLLM 0.32's Messages API does (tests/standin.py)."""

import asyncio
import json

import httpx
import pytest

from proxy.apis.legs import PREFILL_KV_REQUEST
from proxy.apis.messages import (
    MessagesCache,
    MessagesStream,
    messages_cache_of,
    patch_messages_body,
    prefill_body,
    release_body,
)
from tests.proxy_cluster import Cluster
from tests.standin import parse_events, prefill_legs

BODY = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "Say hello."}], "system": "Be terse."}


def test_legs_are_chats_one_token_prefill_and_one_token_release():
    body = {**BODY, "stream": True, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    leg = prefill_body(body)
    assert leg["max_tokens"] == 1 and leg["stream"] is False and leg["kv_transfer_params"] == PREFILL_KV_REQUEST
    assert leg["thinking"] == body["thinking"] and leg["system"] == "Be terse."  # they change the prompt
    assert body["max_tokens"] == 9 and body["stream"] is True
    params = {"remote_engine_id": "e"}
    assert release_body(body, params) == {**leg, "kv_transfer_params": params}


def test_prefill_then_decode_with_the_returned_kv_params_and_the_prefills_cache_reads():
    with Cluster() as c:
        c.p1.cached_tokens = c.p2.cached_tokens = 32
        response = httpx.post(c.url + "/v1/messages", json=BODY)
        metrics = httpx.get(c.url + "/metrics").text
    assert response.status_code == 200, response.text
    (prefill,) = prefill_legs(c.p1) + prefill_legs(c.p2)
    (decode,) = c.d.received
    assert prefill["max_tokens"] == 1 and decode["max_tokens"] == 9
    assert decode["kv_transfer_params"]["remote_request_id"] == response.headers["x-request-id"]
    reply = response.json()
    assert "standin" in reply["content"][0]["text"]
    # The decode stand-in read nothing from a cache: 40 input tokens. The prefill read 32.
    assert reply["usage"]["cache_read_input_tokens"] == 32 and reply["usage"]["input_tokens"] == 8
    assert 'pdspec_proxy_requests_total{endpoint="messages",status="200"} 1.0' in metrics


def test_streaming_relays_the_event_lines_and_patches_both_usages():
    with Cluster() as c:
        c.p1.cached_tokens = c.p2.cached_tokens = 24
        with httpx.stream("POST", c.url + "/v1/messages", json={**BODY, "stream": True}) as response:
            assert response.status_code == 200
            raw = response.read().decode()
    events = parse_events(raw)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert all(kind == data["type"] for kind, data in events)
    assert events[0][1]["message"]["usage"]["cache_read_input_tokens"] == 24
    assert events[-2][1]["usage"] == {
        "input_tokens": 16,
        "output_tokens": events[-2][1]["usage"]["output_tokens"],
        "cache_read_input_tokens": 24,
    }
    text = "".join(d["delta"]["text"] for kind, d in events if kind == "content_block_delta")
    assert "standin" in text


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m", "messages": []}, "max_tokens"),
        ({**BODY, "max_tokens": 0}, "max_tokens"),  # the prefill leg's 1 would pass
        ({**BODY, "stream": "maybe"}, "stream"),
        ({**BODY, "max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 4096}}, "thinking"),
        ({**BODY, "kv_transfer_params": {"do_remote_prefill": True}}, "kv_transfer_params"),
    ],
)
def test_what_only_the_decode_leg_would_refuse_is_refused_up_front(body, param):
    with Cluster() as c:
        response = httpx.post(c.url + "/v1/messages", json=body)
    error = response.json()
    # Anthropic's error format (no `param`): the message names the field.
    assert response.status_code == 400 and error["type"] == "error", error
    assert error["error"]["type"] == "invalid_request_error" and param in error["error"]["message"]
    assert c.p1.received == c.p2.received == c.d.received == []


CONSTRAINED = (
    {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
    {"tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}},
)


def test_structured_output_and_forced_tools_go_through_pd_by_default():
    for extra in CONSTRAINED:
        with Cluster() as c:
            assert httpx.post(c.url + "/v1/messages", json={**BODY, **extra}).status_code == 200
        (prefill,) = prefill_legs(c.p1) + prefill_legs(c.p2)
        assert {key: prefill[key] for key in extra} == extra and c.d.received[0]["kv_transfer_params"] is not None


def test_structured_output_and_forced_tools_are_served_decode_only_under_the_setting():
    for extra in CONSTRAINED:
        with Cluster(routing={"structured_outputs": "decode_only"}) as c:
            assert httpx.post(c.url + "/v1/messages", json={**BODY, **extra}).status_code == 200
        assert prefill_legs(c.p1) + prefill_legs(c.p2) == [] and c.d.received[0]["kv_transfer_params"] is None


def test_a_refused_decode_sends_no_release():
    """The decode worker frees the KV of a request it refuses; a second read could see blocks
    already holding another request's KV."""
    with Cluster(retries={"decode_retries": 0}) as c:
        c.d.fail_decodes = 1
        response = httpx.post(c.url + "/v1/messages", json={**BODY, "stream": True})
        metrics = httpx.get(c.url + "/metrics").text
    assert response.status_code == 502
    (failed,) = c.d.received
    assert failed["kv_transfer_params"] is not None and "pdspec_proxy_kv_releases_total{" not in metrics


def test_a_broken_stream_ends_with_anthropics_error_event():
    with Cluster() as c:
        c.d.break_stream_after = 3
        with httpx.stream("POST", c.url + "/v1/messages", json={**BODY, "stream": True}, timeout=10) as response:
            raw = response.read().decode()
    kind, error = parse_events(raw)[-1]
    assert kind == "error" and error["type"] == "error" and error["error"]["type"] == "api_error"


def test_the_prefills_cache_creation_replaces_the_decode_workers():
    """The decode worker wrote none of the prompt it pulled to a cache (0); a colocated
    vLLM reports what it computed, as the prefill worker does."""
    decoded = json.dumps(
        {
            "usage": {
                "input_tokens": 130,
                "output_tokens": 2,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            }
        }
    ).encode()
    prefill_reply = {
        "usage": {
            "input_tokens": 2,
            "output_tokens": 1,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 128,
        }
    }
    cache = messages_cache_of(prefill_reply)
    assert cache == MessagesCache(read=0, created=128)
    assert json.loads(patch_messages_body(decoded, cache))["usage"] == {
        "input_tokens": 2,
        "output_tokens": 2,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 128,
    }
    assert messages_cache_of({"usage": {"input_tokens": 3, "output_tokens": 1}}) is None


def test_usage_patch_moves_input_tokens_by_the_difference():
    body = json.dumps({"usage": {"input_tokens": 40, "output_tokens": 2, "cache_read_input_tokens": 0}}).encode()
    assert json.loads(patch_messages_body(body, 32))["usage"] == {
        "input_tokens": 8,
        "output_tokens": 2,
        "cache_read_input_tokens": 32,
    }
    no_details = json.dumps({"usage": {"input_tokens": 40, "output_tokens": 2}}).encode()
    assert patch_messages_body(no_details, 32) == no_details  # workers without prompt-token details

    async def one():
        yield (
            b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":40,'
            b'"output_tokens":0,"cache_read_input_tokens":0}}}\n\n'
        )

    async def collect():
        return b"".join([chunk async for chunk in MessagesStream(10).relay(one())])

    (event,) = parse_events(asyncio.run(collect()).decode())
    assert event[1]["message"]["usage"] == {"input_tokens": 30, "output_tokens": 0, "cache_read_input_tokens": 10}
