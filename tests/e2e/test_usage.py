"""usage.prompt_tokens_details.cached_tokens keeps its shape through the real 1P1D
stack (whose workers cache nothing, so it is 0), whole and streamed. That the number is
the prefill worker's: tests/e2e/test_faults.py, whose workers cache prefixes."""

from __future__ import annotations

import json

from tests.prompts import completion_body, unique_prompt


def test_whole_reply_reports_the_prefill_workers_cached_tokens(stack, client):
    response = client.post(stack.proxy_url + "/v1/completions", json=completion_body(unique_prompt(60)))
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 60
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_streamed_usage_reports_the_prefill_workers_cached_tokens(stack, client):
    body = completion_body(unique_prompt(60), stream=True, stream_options={"include_usage": True})
    with client.stream("POST", stack.proxy_url + "/v1/completions", json=body) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    usage = [json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage")]
    assert usage and usage[-1]["prompt_tokens"] > 60
    assert usage[-1]["prompt_tokens_details"]["cached_tokens"] == 0
    assert events[-1] == "[DONE]"
