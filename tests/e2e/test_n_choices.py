"""`n > 1` through the real 1P1D stack: one prefill and one decode per choice (vLLM's
own n > 1 decode over one prefill's KV reads blocks the prefill worker already freed)."""

from __future__ import annotations

import json

from tests import harness
from tests.prompts import completion_body, unique_prompt

MAX_TOKENS = 12


def test_n_choices_whole(stack, client):
    body = completion_body(unique_prompt(60), n=3, temperature=0.8, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True)
    reply = client.post(stack.proxy_url + "/v1/completions", json=body).json()
    assert sorted(c["index"] for c in reply["choices"]) == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in reply["choices"])
    assert reply["usage"]["completion_tokens"] == 3 * MAX_TOKENS
    assert reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] + 3 * MAX_TOKENS


def test_n_choices_streamed_chat(stack, client):
    body = {
        "model": "pdspec-tiny",
        "messages": [{"role": "user", "content": "import json"}],
        "n": 2,
        "temperature": 0.8,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", stack.proxy_url + "/v1/chat/completions", json=body) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    assert {choice["index"] for c in chunks for choice in c["choices"]} == {0, 1}
    assert chunks[-1]["usage"]["completion_tokens"] == 2 * MAX_TOKENS
    for url in (stack.prefill_url, stack.decode_url):
        assert harness.wait_idle(url) == (0, 0), url
