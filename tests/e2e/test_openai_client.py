"""The official `openai` Python client against the proxy, with real workers."""

import time

import httpx
import openai
import pytest

from tests.prompts import COMPLETION_PROMPTS


@pytest.fixture
def oai(stack):
    return openai.OpenAI(base_url=stack.proxy_url + "/v1", api_key="unused", max_retries=0)


def test_completions_plain_and_streamed_agree(oai):
    plain = oai.completions.create(model="pdspec-tiny", prompt=COMPLETION_PROMPTS[0], max_tokens=16, temperature=0)
    streamed = oai.completions.create(
        model="pdspec-tiny",
        prompt=COMPLETION_PROMPTS[0],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    assert plain.choices[0].text and plain.usage.completion_tokens == 16
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16


def test_chat_plain_and_streamed_agree(oai):
    messages = [{"role": "user", "content": "Write a loop over a list."}]
    plain = oai.chat.completions.create(model="pdspec-tiny", messages=messages, max_tokens=16, temperature=0)
    streamed = oai.chat.completions.create(
        model="pdspec-tiny", messages=messages, max_tokens=16, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert plain.choices[0].message.content and text == plain.choices[0].message.content


def test_errors_surface_as_openai_exceptions(oai):
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="pdspec-tiny", prompt="x", max_tokens=-3)
    assert [m.id for m in oai.models.list()] == ["pdspec-tiny"]


def test_a_large_non_streamed_reply_comes_back_and_its_worker_stays_in_service(oai, stack):
    """Issue 9: about 800 KB of logprobs had no answer after 180 s (the worker client
    paused reading at 256 KiB and never resumed), and a paused connection put back in
    the pool timed out the next legs and health checks on that worker."""
    reply = oai.with_options(timeout=120).chat.completions.create(
        model="pdspec-tiny",
        messages=[{"role": "user", "content": "Count to a thousand."}],
        max_tokens=700,
        temperature=0,
        logprobs=True,
        top_logprobs=20,
        extra_body={"ignore_eos": True},
    )
    tokens = reply.choices[0].logprobs.content
    assert len(tokens) == 700 and all(len(t.top_logprobs) == 20 for t in tokens)
    assert len(reply.model_dump_json()) > 512 * 1024  # well past the client's read-ahead limit
    # Three health-check intervals: neither worker is ever ejected...
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        assert httpx.get(stack.proxy_url + "/ready").status_code == 200  # one worker each: both healthy
        time.sleep(0.5)  # between polls
    # ...and the next legs on its connections are answered.
    for _ in range(3):
        small = oai.completions.create(model="pdspec-tiny", prompt=COMPLETION_PROMPTS[0], max_tokens=4, temperature=0)
        assert small.usage.completion_tokens == 4
