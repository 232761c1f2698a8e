"""Prompts the end-to-end tests send, and how to send them the same way everywhere."""

from __future__ import annotations

import json
import uuid

import httpx

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
    return {"model": "pdspec-tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": stream, **extra}  # fmt: skip


def chat_body(messages: list, stream: bool = False, **extra) -> dict:
    return {"model": "pdspec-tiny", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": stream, **extra}  # fmt: skip


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
            event = json.loads(line[len("data: "):])
            assert "error" not in event, event
            for choice in event["choices"]:
                parts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(parts)
