"""Tool calls and reasoning with real workers behind the proxy, through the official
`openai` client, on a stack of this module's own (ports 21000-21600, a models folder
of its own: the shared stack and other engineers' runs are left alone).

The stack runs the local model's defaults (hermes tool parser, auto tool choice) plus
vLLM's text-marker reasoning parser `granite` ("Here is my thought process:" / "Here is
my response:"; the tiny tokenizer has no <think> tokens for qwen3's parser) and
`structured_outputs_config.enable_in_reasoning`: granite's parser cannot tell vLLM from
token ids where reasoning ends, so without it vLLM never applies a grammar (seen: a
named tool_choice came back as free text).

Every request here goes through P/D, and each test proves it (the decode worker's NIXL
bytes rise, nothing is served decode-only): a structured-outputs regex that forces a
reasoning/answer split, a named tool call, a multi-turn conversation with tools and tool
results (`tool_choice="auto"`), and a plain chat. After every test the prefill worker
holds no KV.
"""

from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI

from tests import harness
from tests.prompts import WEATHER_TOOLS

# Starts workers of its own: in a full run, after the shared stack is gone (two cores).
pytestmark = pytest.mark.after_stack

BASE = 21000
# Grammars apply inside reasoning too (see above); compact JSON (no free whitespace) and
# the xgrammar backend are the local model's defaults already (`model.compact_json`), and
# pdspec writes them key by key, so this flag adds to them. (vLLM's dotted form: pdspec's
# CLI cannot read a JSON object inside its list.)
STRUCTURED_OUTPUTS = json.dumps(["--structured-outputs-config.enable_in_reasoning", "true"])
TOOLS = WEATHER_TOOLS
# A reasoning part and an answer part, in granite's markers.
REASONED = r"Here is my thought process: [a-z]{3,12}( [a-z]{3,12}){0,3}\. Here is my response: [a-z]{3,12}\."
THOUGHT = r"[a-z]{3,12}( [a-z]{3,12}){0,3}\."
ANSWER = r"[a-z]{3,12}\."


@pytest.fixture(scope="module")
def tool_stack(tmp_path_factory):
    run = tmp_path_factory.mktemp("tools-and-reasoning")
    extra = [
        "--model.models_dir",
        str(run / "models"),  # its own copy: installing never touches the shared one
        "--model.reasoning_parser",
        "granite",
        "--prefill.extra_vllm_args",
        STRUCTURED_OUTPUTS,
        "--decode.extra_vllm_args",
        STRUCTURED_OUTPUTS,
    ]
    stack = harness.start_stack(run / "run", base_port=BASE, extra_args=extra)
    try:
        # One request through P/D first: the prefill worker's KV gauges exist only once its
        # engine served something, and the decode-only tests would leave them unset.
        body = {"model": "pdspec-tiny", "messages": weather_question(-1), "max_tokens": 2}
        httpx.post(stack.proxy_url + "/v1/chat/completions", json=body, timeout=120).raise_for_status()
        assert nixl_bytes(stack) > 0
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def oai(tool_stack):
    return OpenAI(base_url=tool_stack.proxy_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(autouse=True)
def prefill_worker_left_with_no_kv(tool_stack):
    yield
    assert harness.wait_idle(tool_stack.prefill_url, timeout_s=10) == (0, 0)


def nixl_bytes(stack) -> float:
    return harness.scrape(stack.decode_url).get("vllm:nixl_bytes_transferred_sum", 0.0)


def decode_only(stack) -> float:
    samples = harness.scrape_labeled(stack.proxy_url, "pdspec_proxy_decode_only_total")
    return samples.get((("reason", "structured_output"),), 0.0)


class Route:
    """What a request did to the stack: KV bytes moved, decode-only requests counted."""

    def __init__(self, stack) -> None:
        self.stack = stack
        self.bytes_before, self.decode_only_before = nixl_bytes(stack), decode_only(stack)

    def moved(self) -> float:
        return nixl_bytes(self.stack) - self.bytes_before

    def decode_only(self) -> float:
        return decode_only(self.stack) - self.decode_only_before


def weather_question(n: int) -> list[dict]:
    return [{"role": "user", "content": f"What is the weather in Paris today? Question {n}."}]


# Whole replies only: streamed, granite's parser puts the first word of "Here is my
# response:" into `reasoning` (vLLM's streaming parser, decode-only here; README).
@pytest.mark.parametrize("stream", [False], ids=["whole"])
def test_reasoning_and_answer_are_split(tool_stack, oai, stream):
    import re

    route = Route(tool_stack)
    kwargs = dict(
        model="pdspec-tiny",
        messages=[{"role": "user", "content": f"Think, then answer {int(stream)}."}],
        max_tokens=80,
        temperature=0,
        extra_body={"structured_outputs": {"regex": REASONED}},
    )
    if stream:
        reasoning, content = "", ""
        for chunk in oai.chat.completions.create(stream=True, **kwargs):
            delta = chunk.choices[0].delta if chunk.choices else None
            reasoning += (getattr(delta, "reasoning", None) or "") if delta else ""
            content += (delta.content or "") if delta else ""
    else:
        message = oai.chat.completions.create(**kwargs).choices[0].message
        reasoning, content = message.reasoning, message.content  # vLLM 0.32's field: `reasoning`
    # The markers are gone, each part is what the regex forced there.
    assert re.fullmatch(THOUGHT, reasoning.strip()), (reasoning, content)
    assert re.fullmatch(ANSWER, content.strip()), (reasoning, content)
    assert route.decode_only() == 0 and route.moved() > 0  # a grammar, through P/D


def test_a_named_tool_call_with_a_reasoning_parser_on(tool_stack, oai):
    """The grammar applies from the first token (enable_in_reasoning), so the reply is the
    call alone: the reasoning parser finds no reasoning, the call is parsed out whole."""
    import json

    route = Route(tool_stack)
    reply = oai.chat.completions.create(
        model="pdspec-tiny",
        messages=weather_question(3),
        tools=TOOLS,
        max_tokens=60,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and not reply.choices[0].message.reasoning
    assert set(json.loads(call.function.arguments)) == {"city", "unit"}
    assert route.decode_only() == 0 and route.moved() > 0


def test_tool_results_conversation_goes_through_pd_with_tools_rendered(tool_stack, oai):
    """A second turn after a tool call: the template renders the tools, the assistant's
    tool call and the tool's result (counted against the shipped tokenizer), no grammar,
    so the prompt's KV is prefilled on the prefill worker and moved to the decode worker."""
    from transformers import AutoTokenizer

    messages = weather_question(2) + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear", "temperature": 21}'},
    ]
    route = Route(tool_stack)
    reply = oai.chat.completions.create(
        model="pdspec-tiny", messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=16, temperature=0
    )
    tokenizer = AutoTokenizer.from_pretrained(tool_stack.run_dir.parent / "models" / "target")

    def tokens(*args, **kwargs) -> int:
        text = tokenizer.apply_chat_template(*args, add_generation_prompt=True, tokenize=False, **kwargs)
        return len(tokenizer.encode(text, add_special_tokens=False))

    expected, plain = tokens(messages, tools=TOOLS), tokens(weather_question(2))
    assert reply.usage.prompt_tokens == expected > plain + 100  # the tools block and both turns
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 16
    assert route.moved() > 0 and route.decode_only() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_plain_chat_through_pd_is_all_content_with_a_reasoning_parser_on(tool_stack, oai, stream):
    """Unmarked text is content, none of it reasoning: the parser changes no plain reply,
    and the stream's content equals the whole reply's (greedy, the same prompt)."""
    route = Route(tool_stack)
    kwargs = dict(
        model="pdspec-tiny",
        messages=[{"role": "user", "content": "Tell me about the sea."}],
        max_tokens=12,
        temperature=0,
    )
    whole = oai.chat.completions.create(**kwargs).choices[0].message
    assert whole.content and not whole.reasoning
    if stream:
        content, reasoning = "", ""
        for chunk in oai.chat.completions.create(stream=True, **kwargs):
            delta = chunk.choices[0].delta if chunk.choices else None
            content += (delta.content or "") if delta else ""
            reasoning += (getattr(delta, "reasoning", None) or "") if delta else ""
        assert (content, reasoning) == (whole.content, "")
    assert route.moved() > 0 and route.decode_only() == 0
