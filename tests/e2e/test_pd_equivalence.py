"""Greedy output through the proxy (prefill on P, KV over NIXL, decode on D) equals one
colocated vLLM server's, for completions and chat, streamed and not."""

import pytest

from tests.prompts import CHAT_MESSAGES, COMPLETION_PROMPTS, chat_body, complete, completion_body, completion_outputs


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_completions_match_colocated(stack, reference_outputs, client, stream):
    assert completion_outputs(client, stack.proxy_url, stream) == reference_outputs["completions"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_chat_matches_colocated(stack, reference_outputs, client, stream):
    outputs = [
        complete(client, stack.proxy_url, "/v1/chat/completions", chat_body(m, stream=stream))
        for m in CHAT_MESSAGES
    ]
    assert all(outputs), "empty chat reply"
    assert outputs == reference_outputs["chat"]


def test_request_id_is_honoured_on_both_legs_and_returned(stack, client):
    body = completion_body(COMPLETION_PROMPTS[0])
    response = client.post(stack.proxy_url + "/v1/completions", json=body, headers={"X-Request-Id": "pdspec-test-42"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "pdspec-test-42"
    # vLLM builds its response id from X-Request-Id: the decode leg got ours.
    assert "pdspec-test-42" in response.json()["id"]


def test_models_and_health(stack, client):
    assert client.get(stack.proxy_url + "/health").status_code == 200
    models = client.get(stack.proxy_url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["pdspec-tiny"]
