"""The local model's chat template: plain ChatML as before, tools and tool calls in
hermes' format, and the shipped copy equal to the source."""

import json

import pytest
from transformers import AutoTokenizer

from pdspec.models.build import SHIPPED
from pdspec.models.tokenizer import CHAT_TEMPLATE

# The template before tools were rendered: conversations without tools must tokenize as
# they did with it (every earlier output and reference depends on it).
PLAIN_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(SHIPPED / "target")


def render(tokenizer, messages, **kwargs):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def test_shipped_template_is_the_source_template():
    assert (SHIPPED / "target" / "chat_template.jinja").read_text() == CHAT_TEMPLATE


def test_conversation_without_tools_renders_as_plain_chatml(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    assert render(tokenizer, messages) == render(tokenizer, messages, chat_template=PLAIN_CHATML)


def test_tools_are_listed_in_a_system_turn_after_the_clients_own(tokenizer):
    text = render(
        tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], tools=TOOLS
    )
    system, user = text.split("<|im_end|>\n")[:2]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    listed = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(listed) == TOOLS[0]
    assert user == "<|im_start|>user\nhi"


def test_tool_calls_and_tool_results_round_trip_in_hermes_format(tokenizer):
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
    ]
    text = render(tokenizer, messages, tools=TOOLS)
    assistant = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    calls = [json.loads(part.split("</tool_call>")[0]) for part in assistant.split("<tool_call>\n")[1:]]
    assert calls == [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Rome"}},
    ]
    # Consecutive tool results are one user turn, as Qwen's templates make them.
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_hermes_parser_reads_back_what_the_template_writes(tokenizer):
    """vLLM's hermes parser (the local default) extracts the tool call the template
    renders for an assistant turn: the model's format and the parser's agree."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    call = {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    text = render(
        tokenizer, [{"role": "user", "content": "?"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    )
    reply = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "?"}], tools=TOOLS)
    extracted = Hermes2ProToolParser(tokenizer).extract_tool_calls(reply, request)
    assert extracted.tools_called
    assert [(c.function.name, json.loads(c.function.arguments)) for c in extracted.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
