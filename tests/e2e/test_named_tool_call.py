"""A named tool call through P/D on the stack `make run` starts, with the official
`openai` client: whole and streamed, the reply carries a call of the named function
whose arguments hold to its strict schema, the prompt's KV crossed over NIXL (the decode
worker's bytes rise, nothing was served decode-only), the prefill worker's KV is freed,
and the call equals the one the decode worker writes when it prefills the prompt itself.

This works on the local model thanks to its defaults (`model.compact_json`,
`model.tool_call_grammar = "arguments"`, pdspec/worker/launch.py): without them it fills
the call's JSON with newlines until max_tokens and no call comes back."""

import json

import httpx
import openai
import pytest

from tests import harness
from tests.prompts import WEATHER_TOOLS, unique_prompt

TOOLS = WEATHER_TOOLS
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture
def oai(stack):
    return openai.OpenAI(base_url=stack.proxy_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def nixl_bytes(stack) -> float:
    return harness.scrape(stack.decode_url).get("vllm:nixl_bytes_transferred_sum", 0.0)


def decode_only(stack) -> float:
    return harness.scrape_labeled(stack.proxy_url, "pdspec_proxy_decode_only_total").get(
        (("reason", "structured_output"),), 0.0
    )


def question() -> list[dict]:
    return [{"role": "user", "content": "What is the weather in " + unique_prompt(40) + "?"}]


def assert_holds_to_the_schema(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")
    assert isinstance(args["city"], str) and len(args["city"]) <= 12


def test_a_named_tool_call_through_pd_whole(oai, stack):
    messages = question()
    before, decode_only_before = nixl_bytes(stack), decode_only(stack)
    reply = oai.chat.completions.create(
        model="pdspec-tiny", messages=messages, tools=TOOLS, tool_choice=NAMED, max_tokens=60, temperature=0
    )
    assert nixl_bytes(stack) > before and decode_only(stack) == decode_only_before  # through P/D
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert_holds_to_the_schema(call.function.arguments)
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)

    # The same request prefilled by the decode worker itself writes the same call.
    body = {
        "model": "pdspec-tiny",
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": NAMED,
        "max_tokens": 60,
        "temperature": 0,
    }
    direct = httpx.post(stack.decode_url + "/v1/chat/completions", json=body, timeout=120)
    assert direct.status_code == 200, direct.text[:300]
    assert direct.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == call.function.arguments


def test_a_named_tool_call_through_pd_streamed(oai, stack):
    messages = question()
    before = nixl_bytes(stack)
    whole = oai.chat.completions.create(
        model="pdspec-tiny", messages=messages, tools=TOOLS, tool_choice=NAMED, max_tokens=60, temperature=0
    )
    stream = oai.chat.completions.create(
        model="pdspec-tiny",
        messages=messages,
        tools=TOOLS,
        tool_choice=NAMED,
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    deltas = [d for chunk in stream if chunk.choices for d in chunk.choices[0].delta.tool_calls or ()]
    assert nixl_bytes(stack) > before
    assert {d.index for d in deltas} == {0}
    assert "".join(d.function.name or "" for d in deltas if d.function) == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments
    assert_holds_to_the_schema(arguments)
    assert harness.wait_idle(stack.prefill_url, timeout_s=10) == (0, 0)
