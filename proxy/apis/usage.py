"""`usage.prompt_tokens_details.cached_tokens` as the client should see it.

The number a client cares about is how many prompt tokens were served from a prefix
cache instead of computed. In P/D the prompt is computed on the prefill worker, so that
is the prefill worker's count. vLLM 0.32's NIXL path forwards it to the decode worker
(`remote_prefill_cached_tokens` in `kv_transfer_params`), which then reports it; a
decode worker that does not (another vLLM version, another connector) would report only
its own local hits, 0 when the KV came over NIXL. The proxy copies the prefill leg's
number into the decode reply, whole or streamed, so the client gets the right number
whichever vLLM the decode workers run. Workers report it with vLLM's
`--enable-prompt-tokens-details`.

This module holds OpenAI's `usage.prompt_tokens_details` (completions and chat); the
Responses and Anthropic Messages APIs report their counts in fields of their own, patched
in their modules (proxy/apis/responses.py, proxy/apis/messages.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson

_MARKER = b'"prompt_tokens_details"'


def cached_tokens_of(reply: dict) -> int | None:
    """The prefill leg's `cached_tokens`, if it reported one."""
    usage = reply.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) else None


def _patch_object(reply: dict, cached_tokens: int) -> bool:
    usage = reply.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(details, dict):
        return False
    details["cached_tokens"] = cached_tokens
    return True


def patch_body(body: bytes, cached_tokens: int | None) -> bytes:
    """A whole JSON reply with the prefill leg's `cached_tokens`."""
    if cached_tokens is None or _MARKER not in body:
        return body
    try:
        reply = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(reply, dict) or not _patch_object(reply, cached_tokens):
        return body
    return orjson.dumps(reply)


def _patch_event(event: bytes, cached_tokens: int) -> bytes:
    if _MARKER not in event or not event.startswith(b"data: "):
        return event
    try:
        chunk = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        return event
    if not isinstance(chunk, dict) or not _patch_object(chunk, cached_tokens):
        return event
    return b"data: " + orjson.dumps(chunk)


async def patch_stream(chunks: AsyncIterator[bytes], cached_tokens: int | None) -> AsyncIterator[bytes]:
    """A server-sent event stream with the prefill leg's `cached_tokens` in its usage
    chunks. Events are re-framed on their blank-line boundaries, since one network
    chunk can hold part of an event or several."""
    if cached_tokens is None:
        async for chunk in chunks:
            yield chunk
        return
    pending = b""
    async for chunk in chunks:
        pending += chunk
        if b"\n\n" not in pending:
            continue
        *events, pending = pending.split(b"\n\n")
        yield b"".join(_patch_event(event, cached_tokens) + b"\n\n" for event in events)
    if pending:
        yield _patch_event(pending, cached_tokens)
