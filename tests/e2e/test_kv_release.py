"""No prefill leg leaves KV parked, whatever the API and options (issue 39): every case of
the e2e suites (tests/api_cases.py: one per API and option, the odd-but-valid bodies, the
bad-input corpus, the refused Responses and Messages bodies) goes through the proxy of the
shared stack, and within 10 s after its answer the prefill worker runs nothing and holds
no KV (its lease is 30 s on the test stack, so a prompt parked until the lease frees it
still shows).

The case that failed this before: a Messages request with a named tool. vLLM parsed the
prefill leg's one token as the tool's JSON arguments and answered 400 after its engine
had parked the prompt's KV, which the proxy could not release (prefill_worker/reply_guard.py).
"""

from __future__ import annotations

import json

import pytest

from tests import harness
from tests.api_cases import ACCEPTED_AS_VLLM_ACCEPTS, BAD_REQUESTS, OPTION_CASES, REFUSED_CASES

# A third of the test stack's lease. It was 2 s: vLLM frees a read prompt's blocks once the
# decode worker's NIXL notification reaches the prefill engine's next step, and one fanned-
# out stream (chat, n 2) of a fresh-clone run on 2026-12-04 still held a block after 2 s
# (freed by a read, not by the lease); it passed 17 times since, alone and in the battery.
RELEASE_WITHIN_S = 10.0


def send(client, url: str, path: str, body: dict | bytes) -> tuple[int, bytes]:
    """The answer's status and whole body (a stream read to its end)."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with client.stream("POST", url + path, content=content, headers={"content-type": "application/json"}) as reply:
        return reply.status_code, reply.read()


def assert_nothing_parked(stack, case: str) -> None:
    assert harness.wait_idle(stack.prefill_url, timeout_s=RELEASE_WITHIN_S) == (0, 0), (
        f"{case}: the prefill worker still runs or holds KV {RELEASE_WITHIN_S} s after the answer"
    )


@pytest.mark.parametrize("name, path, body", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_every_api_and_option_is_served_and_parks_no_kv(stack, client, name, path, body):
    status, data = send(client, stack.proxy_url, path, body)
    assert status == 200, (name, data[:300])
    assert_nothing_parked(stack, name)


@pytest.mark.parametrize("name, path, body, status", REFUSED_CASES, ids=[c[0] for c in REFUSED_CASES])
def test_refused_responses_and_messages_park_no_kv(stack, client, name, path, body, status):
    got, data = send(client, stack.proxy_url, path, body)
    assert got == status, (name, data[:300])
    assert_nothing_parked(stack, name)


def test_the_corpora_park_no_kv(stack, client):
    """The bad-input corpus and the odd-but-valid bodies, one after another, each checked."""
    for index, (path, body, status) in enumerate(BAD_REQUESTS):
        got, data = send(client, stack.proxy_url, path, body)
        assert got == status, (index, data[:300])
        assert_nothing_parked(stack, f"bad request {index}")
    for index, (path, body) in enumerate(ACCEPTED_AS_VLLM_ACCEPTS):
        got, data = send(client, stack.proxy_url, path, body)
        assert got == 200, (index, data[:300])
        assert_nothing_parked(stack, f"accepted body {index}")


def rescued(stack) -> float:
    return harness.scrape_labeled(stack.prefill_url, "pdspec_prefill_replies_rescued_total").get(
        (("api", "messages"),), 0.0
    )


def test_a_messages_named_tool_call_is_served_as_the_decode_worker_serves_it(stack, client):
    """Through P/D it was a 400 (the prefill's one token parsed as JSON); now a tool_use
    block, the same as the decode worker's own, and the prefill's rescue counted."""
    body = dict(next(b for n, _, b in OPTION_CASES if n == "messages-tool-named"))
    before = rescued(stack)
    through = client.post(stack.proxy_url + "/v1/messages", json=body)
    direct = client.post(stack.decode_url + "/v1/messages", json=body)
    assert through.status_code == direct.status_code == 200, through.text[:300]
    assert [b["type"] for b in through.json()["content"]] == [b["type"] for b in direct.json()["content"]]
    assert [b for b in through.json()["content"] if b["type"] == "tool_use"][0]["name"] == "get_weather"
    assert rescued(stack) > before
    assert_nothing_parked(stack, "messages-tool-named")
