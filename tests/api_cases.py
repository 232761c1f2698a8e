"""Request cases over the four APIs the proxy serves, shared by the end-to-end suites: the
bad-input corpus (tests/e2e/test_bad_input.py), the odd-but-valid bodies vLLM accepts, and
one case per API and option (`OPTION_CASES`). tests/e2e/test_kv_release.py sends every one
of them through the proxy and checks that no prefill KV stays parked after it."""

from __future__ import annotations

import json

from tests.prompts import WEATHER_TOOLS

C, CHAT, RESPONSES, MESSAGES = "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"
M = '"model": "pdspec-tiny"'
MSG = '"messages": [{"role": "user", "content": "hi"}]'


def raw(text: str) -> bytes:
    return text.encode()


BAD_REQUESTS = [
    # malformed bodies
    (C, b"{not json", 400),
    (C, b"", 400),
    (C, b"{", 400),
    (C, b'{"model": "pdspec-tiny", "prompt": "x",}', 400),
    (C, b"\xff\xfe\x00", 400),
    (C, b'{"model": "pdspec-tiny", "prompt": "\xc3\x28"}', 400),
    (C, b"[]", 400),
    (C, b'"just a string"', 400),
    (C, b"42", 400),
    (C, b"null", 400),
    (CHAT, b"{not json", 400),
    (CHAT, b"[1, 2]", 400),
    # missing fields
    (C, b"{}", 400),
    (C, raw(f"{{{M}}}"), 400),
    (CHAT, raw(f"{{{M}}}"), 400),
    # wrong types
    (C, raw('{"model": 7, "prompt": "x"}'), 400),
    (C, raw(f'{{{M}, "prompt": 5}}'), 400),
    (C, raw(f'{{{M}, "prompt": {{"a": 1}}}}'), 400),
    (C, raw(f'{{{M}, "prompt": [1, "a"]}}'), 400),
    (C, raw(f'{{{M}, "prompt": [-1, 2]}}'), 400),
    (C, raw(f'{{{M}, "prompt": ""}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "max_tokens": "three"}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "max_tokens": 2.5}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "temperature": "hot"}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "top_p": 0}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "stop": 5}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "stream_options": "all"}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "logprobs": -1}}'), 400),
    (CHAT, raw(f'{{{M}, "messages": "hello"}}'), 400),
    (CHAT, raw(f'{{{M}, "messages": []}}'), 400),
    (CHAT, raw(f'{{{M}, "messages": [{{"role": "user", "content": 7}}]}}'), 400),
    (CHAT, raw(f'{{{M}, "messages": [{{"content": "x"}}]}}'), 400),
    (CHAT, raw(f'{{{M}, {MSG}, "max_completion_tokens": "x"}}'), 400),
    # values out of range
    (C, raw(f'{{{M}, "prompt": "x", "max_tokens": -4}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "max_tokens": 0}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "max_tokens": 1000000}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "n": 0}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "temperature": -1}}'), 400),
    (CHAT, raw(f'{{{M}, {MSG}, "max_tokens": -1}}'), 400),
    (CHAT, raw(f'{{{M}, {MSG}, "max_completion_tokens": 1000000}}'), 400),
    # fields clients may not set
    (C, raw(f'{{{M}, "prompt": "x", "kv_transfer_params": {{"remote_host": "10.0.0.1"}}}}'), 400),
    (CHAT, raw(f'{{{M}, {MSG}, "kv_transfer_params": {{"do_remote_prefill": true}}}}'), 400),
    # the model and the prompt's length
    (C, raw('{"model": "no-such-model", "prompt": "x", "max_tokens": 2}'), 404),
    (CHAT, raw(f'{{"model": "gpt-4", {MSG}}}'), 404),
    (C, raw(f'{{{M}, "prompt": {json.dumps("word " * 5000)}, "max_tokens": 4}}'), 400),
    (C, raw(f'{{{M}, "prompt": {json.dumps(list(range(3000)))}, "max_tokens": 4}}'), 400),
    # JSON nested deeper than the proxy can re-serialize (was a 500)
    (C, raw(f'{{{M}, "prompt": "x", "extra": {"[" * 300 + "]" * 300}}}'), 400),
    (CHAT, raw(f'{{{M}, {MSG}, "extra": {"[" * 1023 + "]" * 1023}}}'), 400),
    # decode-only fields vLLM would refuse after the prefill pinned KV
    (C, raw(f'{{{M}, "prompt": "x", "min_tokens": -1}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "n": 2, "temperature": 0}}'), 400),
    (C, raw(f'{{{M}, "prompt": "x", "seed": {2**63}}}'), 400),
    # oversized body (limit 4 MiB)
    (C, raw(f'{{{M}, "prompt": "{"x" * (5 * 1024 * 1024)}"}}'), 413),
]


# Odd but valid: vLLM's request models are lax (pydantic's lax mode) and take these, so the
# proxy does too, and answers as the decode worker does on its own (issue 24, item 10).
ACCEPTED_AS_VLLM_ACCEPTS = [
    (C, raw('{"prompt": "x", "max_tokens": 3}')),  # no model: vLLM's served model
    (CHAT, raw(f'{{{MSG}, "max_tokens": 3}}')),
    (C, raw('{"model": null, "prompt": "x", "max_tokens": 3}')),
    (C, raw(f'{{{M}, "prompt": "x", "stream": "yes", "max_tokens": 3}}')),
    (C, raw(f'{{{M}, "prompt": "x", "stream": 1, "max_tokens": 3}}')),
    (C, raw(f'{{{M}, "prompt": "x", "n": "2", "max_tokens": 3}}')),
    (C, raw(f'{{{M}, "prompt": "x", "max_tokens": 4.0}}')),
    (C, raw(f'{{{M}, "prompt": "x", "max_tokens": 3, "logprobs": true}}')),
    (CHAT, raw(f'{{{M}, "messages": [{{"role": "wizard", "content": "x"}}], "max_tokens": 3}}')),
    (
        CHAT,
        raw(
            f'{{{M}, "messages": [{{"role": "function", "name": "f", "content": "1"}}, '
            f'{{"role": "user", "content": "hi"}}], "max_tokens": 3}}'
        ),
    ),
    (CHAT, raw(f'{{{M}, {MSG}, "logprobs": "yes", "max_tokens": 3}}')),
]

WEATHER = WEATHER_TOOLS[0]["function"]
ANTHROPIC_TOOLS = [
    {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "parameters": WEATHER["parameters"],
        "strict": True,
    }
]
_PROMPT = "def read_config(path):"
_USER = [{"role": "user", "content": "What is the weather in Paris? " + _PROMPT}]
_USAGE = {"include_usage": True, "continuous_usage_stats": True}


def _completion(**extra) -> dict:
    return {"model": "pdspec-tiny", "prompt": _PROMPT, "max_tokens": 6, "temperature": 0, **extra}


def _chat(**extra) -> dict:
    return {"model": "pdspec-tiny", "messages": _USER, "max_tokens": 6, "temperature": 0, **extra}


def _responses(**extra) -> dict:
    return {"model": "pdspec-tiny", "input": _PROMPT, "max_output_tokens": 6, "temperature": 0, **extra}


def _messages(**extra) -> dict:
    return {"model": "pdspec-tiny", "messages": _USER, "max_tokens": 6, "temperature": 0, **extra}


# (name, path, body): valid requests, one per API and option the e2e suites use.
OPTION_CASES = [
    ("completions", C, _completion()),
    ("completions-stream", C, _completion(stream=True)),
    ("completions-stream-usage", C, _completion(stream=True, stream_options=_USAGE)),
    ("completions-n2", C, _completion(n=2, temperature=1, seed=7)),
    ("completions-n2-stream-usage", C, _completion(n=2, temperature=1, stream=True, stream_options=_USAGE)),
    ("completions-list", C, _completion(prompt=["a b", "c d", "e f"])),
    ("completions-token-ids", C, _completion(prompt=[101, 102, 103, 104])),
    ("completions-logprobs", C, _completion(logprobs=2)),
    ("completions-prompt-logprobs", C, _completion(prompt_logprobs=1)),
    ("completions-echo", C, _completion(echo=True)),
    ("completions-seed", C, _completion(temperature=1, seed=1234)),
    ("completions-min-tokens-stop", C, _completion(min_tokens=2, stop=["\n"])),
    ("completions-regex", C, _completion(structured_outputs={"regex": "(yes|no)"})),
    ("completions-json-object", C, _completion(response_format={"type": "json_object"})),
    ("completions-beam", C, _completion(use_beam_search=True, n=2)),
    ("completions-whole-context", C, _completion(max_tokens=2048, stop=["\n"])),
    ("chat", CHAT, _chat()),
    ("chat-stream", CHAT, _chat(stream=True, stream_options=_USAGE)),
    ("chat-n2-stream", CHAT, _chat(n=2, temperature=1, stream=True)),
    ("chat-logprobs", CHAT, _chat(logprobs=True, top_logprobs=2)),
    ("chat-json-object", CHAT, _chat(response_format={"type": "json_object"})),
    (
        "chat-json-schema",
        CHAT,
        _chat(response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER["parameters"]}}),
    ),
    (
        "chat-tool-named",
        CHAT,
        _chat(tools=WEATHER_TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    ),
    (
        "chat-tool-named-stream",
        CHAT,
        _chat(tools=WEATHER_TOOLS, stream=True, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    ),
    ("chat-tool-required", CHAT, _chat(tools=WEATHER_TOOLS, tool_choice="required")),
    ("chat-tool-auto", CHAT, _chat(tools=WEATHER_TOOLS, tool_choice="auto")),
    ("chat-tool-none", CHAT, _chat(tools=WEATHER_TOOLS, tool_choice="none")),
    ("chat-max-completion-tokens", CHAT, {**_chat(), "max_completion_tokens": 4}),
    ("chat-whole-context", CHAT, _chat(max_tokens=2048, stop=["\n"])),
    ("responses", RESPONSES, _responses()),
    ("responses-stream", RESPONSES, _responses(stream=True)),
    ("responses-instructions", RESPONSES, _responses(instructions="Answer in Python.")),
    (
        "responses-tool-named",
        RESPONSES,
        _responses(tools=RESPONSES_TOOLS, tool_choice={"type": "function", "name": "get_weather"}),
    ),
    ("responses-tool-required", RESPONSES, _responses(tools=RESPONSES_TOOLS, tool_choice="required")),
    ("responses-tool-auto", RESPONSES, _responses(tools=RESPONSES_TOOLS)),
    ("responses-logprobs", RESPONSES, _responses(top_logprobs=2, include=["message.output_text.logprobs"])),
    ("messages", MESSAGES, _messages()),
    ("messages-stream", MESSAGES, _messages(stream=True)),
    ("messages-system", MESSAGES, _messages(system="You write Python.")),
    ("messages-stop", MESSAGES, _messages(stop_sequences=["\n"])),
    (
        "messages-tool-named",
        MESSAGES,
        _messages(tools=ANTHROPIC_TOOLS, tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=40),
    ),
    (
        "messages-tool-named-stream",
        MESSAGES,
        _messages(
            tools=ANTHROPIC_TOOLS, stream=True, max_tokens=40, tool_choice={"type": "tool", "name": "get_weather"}
        ),
    ),
    ("messages-tool-any", MESSAGES, _messages(tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}, max_tokens=40)),
    ("messages-tool-auto", MESSAGES, _messages(tools=ANTHROPIC_TOOLS, tool_choice={"type": "auto"})),
    ("messages-tool-none", MESSAGES, _messages(tools=ANTHROPIC_TOOLS, tool_choice={"type": "none"})),
    ("messages-whole-context", MESSAGES, _messages(max_tokens=2048, stop_sequences=["\n"])),
]

# (name, path, body, status): requests refused on the Responses and Messages APIs.
REFUSED_CASES = [
    ("responses-previous-id", RESPONSES, _responses(previous_response_id="resp_1"), 400),
    ("responses-beyond-context", RESPONSES, _responses(max_output_tokens=4096), 400),
    ("responses-bad-input", RESPONSES, _responses(input=5), 400),
    ("messages-no-max-tokens", MESSAGES, {k: v for k, v in _messages().items() if k != "max_tokens"}, 400),
    ("messages-bad-messages", MESSAGES, _messages(messages="x"), 400),
    ("messages-beyond-context", MESSAGES, _messages(max_tokens=4096), 400),
    ("messages-unknown-model", MESSAGES, _messages(model="no-such-model"), 404),
    (
        "messages-thinking-over-budget",
        MESSAGES,
        _messages(max_tokens=16, thinking={"type": "enabled", "budget_tokens": 64}),
        400,
    ),
]
