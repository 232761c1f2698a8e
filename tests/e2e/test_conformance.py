"""The third adversarial probe's conformance gaps (issue 39), each against the decode worker
of the shared stack answering the same request itself: the proxy answers as vLLM does.
Each of these failed on the proxy before its fix."""

from __future__ import annotations

import json
import socket

import pytest

from tests.prompts import completion_body

C, CHAT, MESSAGES = "/v1/completions", "/v1/chat/completions", "/v1/messages"
JSON = {"content-type": "application/json"}


def context_length(stack, client) -> int:
    return client.get(stack.decode_url + "/v1/models").json()["data"][0]["max_model_len"]


@pytest.mark.parametrize(
    "path, field",
    [(C, "max_tokens"), (CHAT, "max_tokens"), (CHAT, "max_completion_tokens"), (MESSAGES, "max_tokens")],
)
def test_an_output_limit_equal_to_the_context_is_served(stack, client, path, field):
    """vLLM refuses a limit above the context and caps one equal to it; the proxy refused
    it (`>=`)."""
    limit = context_length(stack, client)
    prompt = {"prompt": "def f():"} if path == C else {"messages": [{"role": "user", "content": "def f():"}]}
    stop = {"stop_sequences": ["\n"]} if path == MESSAGES else {"stop": ["\n"]}
    body = {"model": "pdspec-tiny", **prompt, field: limit, "temperature": 0, **stop}
    for url in (stack.decode_url, stack.proxy_url):
        assert client.post(url + path, json=body).status_code == 200, url
    beyond = client.post(stack.proxy_url + path, json={**body, field: limit + 1})
    assert beyond.status_code == 400


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_tokenize_takes_json_bodies_only(stack, client, path, content_type):
    body = (
        {"model": "pdspec-tiny", "prompt": "hi"} if path == "/tokenize" else {"model": "pdspec-tiny", "tokens": [1, 2]}
    )
    headers = {} if content_type is None else {"content-type": content_type}
    for url in (stack.decode_url, stack.proxy_url):
        response = client.post(url + path, content=json.dumps(body).encode(), headers=headers)
        assert response.status_code == 400 and "application/json" in response.text, (url, response.text[:200])


@pytest.mark.parametrize(
    "path, extra",
    [
        (C, {"prompt": ["a b", "c d"]}),
        (C, {"prompt": "a b", "n": 2, "temperature": 1}),
        (CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 2, "temperature": 1}),
    ],
)
def test_continuous_usage_stats_on_every_chunk_of_several_choices(stack, client, path, extra):
    body = {
        "model": "pdspec-tiny",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **extra,
    }
    for url in (stack.decode_url, stack.proxy_url):
        with client.stream("POST", url + path, json=body) as response:
            chunks = [
                json.loads(line[6:])
                for line in response.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"
            ]
        assert chunks and all(chunk.get("usage") for chunk in chunks), (url, chunks[:2])


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-32"])
def test_bodies_in_the_encodings_vllm_reads(stack, client, encoding):
    body = json.dumps(completion_body("def f():", max_tokens=3)).encode(encoding)
    for url in (stack.decode_url, stack.proxy_url):
        response = client.post(url + C, content=body, headers=JSON)
        assert response.status_code == 200, (url, response.text[:200])


def test_a_70_kb_head_is_431(stack):
    """The documented head limit is 64 KiB; a head that arrived in one chunk was never
    counted (served up to about 128 KB)."""
    host, port = stack.proxy_url.removeprefix("http://").split(":")
    payload = json.dumps(completion_body("hi", max_tokens=2)).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nX-Big: "
            + b"a" * (70 * 1024)
            + b"\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]


def test_version_ping_and_load_answer_as_vllm_does(stack, client):
    assert client.get(stack.proxy_url + "/version").json() == client.get(stack.decode_url + "/version").json()
    for method in ("GET", "POST"):
        assert client.request(method, stack.proxy_url + "/ping").status_code == 200
    load = client.get(stack.proxy_url + "/load").json()
    assert set(load) == set(client.get(stack.decode_url + "/load").json()) == {"server_load"}


def test_a_trailing_slash_is_redirected_as_vllm_redirects_it(stack, client):
    body = completion_body("hi", max_tokens=2)
    for url in (stack.decode_url, stack.proxy_url):
        moved = client.post(url + C + "/", json=body, follow_redirects=False)
        assert moved.status_code == 307 and moved.headers["location"] == url + C, url
    assert client.post(stack.proxy_url + C + "/", json=body, follow_redirects=True).status_code == 200


def test_messages_errors_are_anthropic_errors(stack, client):
    """The proxy's own refusals on /v1/messages, in the format the anthropic client reads."""
    refused = client.post(stack.proxy_url + MESSAGES, json={"model": "pdspec-tiny", "messages": "x", "max_tokens": 3})
    assert refused.status_code == 400
    error = refused.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
