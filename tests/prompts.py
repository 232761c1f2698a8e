"""Prompts the end-to-end tests send, and how to send them the same way everywhere."""

from __future__ import annotations

import json
import uuid

import httpx

from pdspec.models.corpus import HELD_OUT_PROMPTS

COMPLETION_PROMPTS = [
    "def read_config(path):\n    with open(path) as",
    "import os\nimport sys\n\n\nclass",
    "    for key, value in sorted(items.items()):\n        if",
]
CHAT_MESSAGES = [
    [{"role": "user", "content": "Write a Python function that parses a URL."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "import json"}],
]
MAX_TOKENS = 24


def completion_body(prompt: str, stream: bool = False, **extra) -> dict:
    return {
        "model": "pdspec-tiny",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
        **extra,
    }


def chat_body(messages: list, stream: bool = False, **extra) -> dict:
    return {
        "model": "pdspec-tiny",
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
        **extra,
    }


# Seeded sampling (issue 39): the same text on every run, through P/D as colocated.
SEEDED_PROMPTS = ["def read_config(path):", COMPLETION_PROMPTS[1]]
SEEDS = [1234, 7]


def seeded_body(prompt: str, seed: int, stream: bool = False) -> dict:
    return {
        "model": "pdspec-tiny",
        "prompt": prompt,
        "max_tokens": 32,
        "temperature": 1.0,
        "seed": seed,
        "stream": stream,
    }


def seeded_outputs(client: httpx.Client, base_url: str, stream: bool = False) -> list[str]:
    """SEEDED_PROMPTS x SEEDS at temperature 1 from one endpoint (what the colocated
    reference's "seeded" hold)."""
    return [
        complete(client, base_url, "/v1/completions", seeded_body(p, s, stream)) for p in SEEDED_PROMPTS for s in SEEDS
    ]


def unique_prompt(words: int = 40) -> str:
    """A prompt no cache has seen, so its KV must come over NIXL, never from a prefix hit."""
    return f"# {uuid.uuid4().hex}\n" + " ".join(f"value_{i}" for i in range(words))


def complete(client: httpx.Client, base_url: str, path: str, body: dict) -> str:
    """The generated text, read from a plain or an SSE response."""
    if not body.get("stream"):
        response = client.post(base_url + path, json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        return choice["text"] if "text" in choice else choice["message"]["content"]
    parts = []
    with client.stream("POST", base_url + path, json=body) as response:
        response.raise_for_status()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            assert "error" not in event, event
            for choice in event["choices"]:
                parts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def completion_outputs(client: httpx.Client, base_url: str, stream: bool) -> list[str]:
    """COMPLETION_PROMPTS' greedy outputs from one endpoint, asserted non-empty (what the
    colocated reference's "completions" hold)."""
    outputs = [
        complete(client, base_url, "/v1/completions", completion_body(p, stream=stream)) for p in COMPLETION_PROMPTS
    ]
    assert all(outputs), "empty completion"
    return outputs


# Held-out prompts for acceptance: code-like text the models never trained on verbatim
# (the six the reference outputs have always been taken on).
ACCEPTANCE_PROMPTS = list(HELD_OUT_PROMPTS[:6])
ACCEPTANCE_MAX_TOKENS = 64


def acceptance_body(prompt: str) -> dict:
    return {
        "model": "pdspec-tiny",
        "prompt": prompt,
        "max_tokens": ACCEPTANCE_MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


def acceptance_length(before: dict, after: dict) -> float:
    """Mean acceptance length, 1 + accepted / drafts, between two /metrics scrapes."""
    drafts = after["vllm:spec_decode_num_drafts_total"] - before.get("vllm:spec_decode_num_drafts_total", 0)
    accepted = after["vllm:spec_decode_num_accepted_tokens_total"] - before.get(
        "vllm:spec_decode_num_accepted_tokens_total", 0
    )
    assert drafts > 0
    return 1 + accepted / drafts


# A tool for the tool-call tests: a strict schema (vLLM, as OpenAI, holds the arguments to
# it only for a strict tool; otherwise a named choice fixes the name and lets the arguments
# be any JSON, seen: "n"), short enough that greedy JSON ends within a few dozen tokens.
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": WEATHER_SCHEMA,
            "strict": True,
        },
    }
]
