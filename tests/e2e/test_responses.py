"""`POST /v1/responses` through P/D with real workers and the official `openai` client
(and `POST /v1/messages` with the official `anthropic` client): text comes back, the
prompt's KV crossed over NIXL, and the prefill worker's KV is freed."""

import anthropic
import openai
import pytest

from tests import harness
from tests.prompts import unique_prompt


@pytest.fixture
def oai(stack):
    return openai.OpenAI(base_url=stack.proxy_url + "/v1", api_key="unused", max_retries=0)


def nixl_bytes(stack) -> float:
    return harness.scrape(stack.decode_url).get("vllm:nixl_bytes_transferred_sum", 0.0)


def handoffs(stack) -> float:
    counts = harness.scrape_labeled(stack.proxy_url, "pdspec_proxy_leg_seconds_count")
    return counts.get((("leg", "handoff"),), 0.0)


def create(oai, prompt: str, stream: bool):
    return oai.with_options(timeout=120).responses.create(
        model="pdspec-tiny",
        input=prompt,
        instructions="Answer briefly.",
        max_output_tokens=16,
        temperature=0,
        stream=stream,
        extra_body={"ignore_eos": True},
    )


def test_plain_and_streamed_responses_through_pd(oai, stack):
    prompt = unique_prompt(80)  # a prompt never sent before; prefix caching is off on the stack anyway

    before, handoffs_before = nixl_bytes(stack), handoffs(stack)
    plain = create(oai, prompt, stream=False)
    moved_plain = nixl_bytes(stack) - before
    assert plain.output_text.strip(), plain
    assert plain.usage.input_tokens > 0 and plain.usage.output_tokens == 16
    assert plain.id.startswith("resp_")
    assert moved_plain > 0, "no KV crossed over NIXL: the decode worker recomputed the prompt"
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)  # released after the pull

    before = nixl_bytes(stack)
    events = list(create(oai, prompt, stream=True))
    moved_streamed = nixl_bytes(stack) - before
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed", types
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert text.strip() and final.output_text == text
    assert final.usage.output_tokens == 16
    # Greedy through P/D either way: the same text, the same prompt's KV moved.
    assert text == plain.output_text
    assert moved_streamed == moved_plain
    # One hand-off each, timed to the decode's first output, not to vLLM's opening events.
    assert handoffs(stack) - handoffs_before == 2
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)
    assert harness.wait_idle(stack.decode_url, timeout_s=10) == (0, 0)


def test_previous_response_id_is_refused_with_an_openai_error(oai, stack):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.responses.create(model="pdspec-tiny", input="hi", previous_response_id="resp_earlier")
    assert "previous_response_id" in str(refused.value)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve("resp_earlier")
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)


def test_anthropic_messages_plain_and_streamed_through_pd(stack):
    client = anthropic.Anthropic(base_url=stack.proxy_url, api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": unique_prompt(80)}]

    before = nixl_bytes(stack)
    # This `anthropic` client takes no `temperature` argument: vLLM reads it from the body.
    greedy = {"extra_body": {"temperature": 0}}
    plain = client.messages.create(model="pdspec-tiny", max_tokens=16, messages=messages, **greedy)
    moved_plain = nixl_bytes(stack) - before
    text = "".join(block.text for block in plain.content if block.type == "text")
    assert text.strip() and plain.usage.output_tokens >= 1
    assert moved_plain > 0, "no KV crossed over NIXL: the decode worker recomputed the prompt"
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)

    before = nixl_bytes(stack)
    events = list(client.messages.create(model="pdspec-tiny", max_tokens=16, messages=messages, stream=True, **greedy))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert streamed == text
    assert nixl_bytes(stack) - before == moved_plain
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)
