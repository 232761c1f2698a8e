"""The prompt's token ids, for cache-aware routing: the ids the engines will hold.

- A completions prompt of token ids is used as it is.
- A text prompt or a chat goes to a worker's own `/tokenize` (vLLM's tokenizer and chat
  template, with the request's template options and tools), so the ids equal what the
  engine will see without a tokenizer or a template engine in the proxy. It costs one
  short call on the local network; `loadtest.proxy_bench` measures it.
- A Responses or Messages body goes to the worker's scale-out render endpoint
  (`/v1/responses/render`, `/v1/messages/render`; served with vLLM's `--enable-scale-out`,
  the `scale_out_api` worker setting, on by default). `/tokenize` cannot render these
  (their `input` items, `instructions`, `system` and content blocks go through vLLM's own
  conversions); render runs those conversions and the chat template as the serving path
  does, and answers a `GenerateRequest` whose `token_ids` are the prompt. The caller
  sends the body the decode leg will carry (`Api.render_body`), so both render alike.
  It costs about what `/tokenize` does (README, "vLLM's scale-out API, evaluated").

Failure policy: whatever goes wrong (a timeout, a worker's error, an odd reply; a worker
without the scale-out API answers render with 403, an older vLLM with 404) gives None,
and the request is routed without knowing the caches, never failed.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.upstream.client import UpstreamClient, UpstreamError

# Chat options that change the rendered prompt, passed to /tokenize as the request has them.
CHAT_TEMPLATE_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
    "documents",
)


def direct_token_ids(body: dict[str, Any], chat: bool) -> list[int] | None:
    """The token ids of a completions prompt given as ids (one prompt), or None."""
    prompt = body.get("prompt")
    if not chat and isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    return None


def tokenize_body(body: dict[str, Any], chat: bool) -> dict[str, Any] | None:
    """The /tokenize request for a text prompt or a chat; None when there is nothing to ask."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        request = {"model": body.get("model"), "messages": messages}
        request.update({name: body[name] for name in CHAT_TEMPLATE_FIELDS if name in body})
        return request
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return None
    request = {"model": body.get("model"), "prompt": prompt}
    if "add_special_tokens" in body:
        request["add_special_tokens"] = body["add_special_tokens"]
    return request


async def prompt_token_ids(
    client: UpstreamClient,
    worker_url: str,
    body: dict[str, Any],
    chat: bool,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> list[int] | None:
    """A completions or chat prompt's ids: given, or from the worker's /tokenize."""
    direct = direct_token_ids(body, chat)
    if direct is not None:
        return direct
    request = tokenize_body(body, chat)
    if request is None:
        return None
    reply = await _post(client, worker_url, "/tokenize", request, timeout_s, headers)
    return _ids(reply.get("tokens")) if isinstance(reply, dict) else None


async def rendered_token_ids(
    client: UpstreamClient,
    worker_url: str,
    path: str,
    body: dict[str, Any],
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> list[int] | None:
    """The prompt ids of `body` as the worker's render endpoint `path` renders it."""
    reply = await _post(client, worker_url, path, body, timeout_s, headers)
    return _ids(reply.get("token_ids")) if isinstance(reply, dict) else None


async def _post(
    client: UpstreamClient,
    worker_url: str,
    path: str,
    request: dict[str, Any],
    timeout_s: float,
    headers: dict[str, str] | None,
) -> Any:
    """The JSON of a 200 reply, or None for anything else."""
    try:
        response = await client.request(
            worker_url,
            "POST",
            path,
            orjson.dumps(request),
            {"Content-Type": "application/json", **(headers or {})},
            timeout_s,
        )
        data = await response.read()
    except UpstreamError:
        return None
    if response.status != 200:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _ids(tokens: Any) -> list[int] | None:
    return tokens if isinstance(tokens, list) and all(type(t) is int for t in tokens) else None
