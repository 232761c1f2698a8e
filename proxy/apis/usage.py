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

The Responses API reports it as `usage.input_tokens_details.cached_tokens` (always, no
flag needed), in the whole reply and in the `response.completed` event of a stream (whose
framing, with `event:` lines, is proxy/apis/responses_stream.py's). When vLLM ran several
generation turns on the decode worker (built-in tools), `cached_tokens` is their sum and
`cached_tokens_per_turn` lists them: only the first turn's prompt came from the prefill
worker, so only that turn's share is replaced. `cache_write_tokens` stays the decode
worker's, as chat's `created_cache_tokens` does.

The Anthropic Messages API reports it as `usage.cache_read_input_tokens` (with
`--enable-prompt-tokens-details`), with `input_tokens` counting only the tokens neither
read from nor written to a cache, so `input_tokens` moves by the difference. Its
`cache_creation_input_tokens` (what the request wrote to a prefix cache) is the prefill
worker's too: the decode worker wrote nothing it computed (0 through P/D against the
prompt's cached blocks on a colocated server). It is in
the whole reply, and in a stream's `message_start` (`message.usage`) and final
`message_delta` (`usage`) events (proxy/apis/messages_stream.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson

_MARKER = b'"prompt_tokens_details"'
RESPONSES_MARKER = b'"input_tokens_details"'
MESSAGES_MARKER = b'"cache_read_input_tokens"'
CREATION_MARKER = b'"cache_creation_input_tokens"'


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


# --- the Responses API: usage.input_tokens_details ---------------------------------------


def responses_cached_tokens_of(reply: dict) -> int | None:
    """The prefill leg's `cached_tokens` in a Responses reply, if it reported one."""
    usage = reply.get("usage")
    details = usage.get("input_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) else None


def patch_responses_usage(usage: object, cached_tokens: int) -> bool:
    """`usage` (a Responses usage object) with the prefill's count for the first turn."""
    details = usage.get("input_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(details, dict):
        return False
    per_turn = details.get("cached_tokens_per_turn")
    total = details.get("cached_tokens")
    if isinstance(per_turn, list) and per_turn and all(isinstance(t, int) for t in per_turn) \
            and isinstance(total, int):  # fmt: skip
        details["cached_tokens"] = total - per_turn[0] + cached_tokens
        per_turn[0] = cached_tokens
    else:
        details["cached_tokens"] = cached_tokens
    return True


def patch_responses_body(body: bytes, cached_tokens: int | None) -> bytes:
    """A whole Responses reply with the prefill leg's `cached_tokens`."""
    if cached_tokens is None or RESPONSES_MARKER not in body:
        return body
    try:
        reply = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(reply, dict) or not patch_responses_usage(reply.get("usage"), cached_tokens):
        return body
    return orjson.dumps(reply)


# --- the Anthropic Messages API: usage.cache_read_input_tokens, cache_creation_input_tokens ---


@dataclass(frozen=True, slots=True)
class MessagesCache:
    """The prefill leg's cache counts in a Messages reply: tokens read from its prefix
    cache, and tokens it computed and wrote to it (None: not reported)."""

    read: int | None
    created: int | None


def messages_cached_tokens_of(reply: dict) -> int | None:
    usage = reply.get("usage")
    value = usage.get("cache_read_input_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) else None


def messages_cache_of(reply: dict) -> MessagesCache | None:
    """What the Messages patchers take from the prefill reply."""
    usage = reply.get("usage")
    if not isinstance(usage, dict):
        return None
    read, created = usage.get("cache_read_input_tokens"), usage.get("cache_creation_input_tokens")
    cache = MessagesCache(read if isinstance(read, int) else None, created if isinstance(created, int) else None)
    return None if cache.read is None and cache.created is None else cache


def patch_messages_usage(usage: object, cache: MessagesCache | int) -> bool:
    """`usage` with the prefill's counts where the decode worker reports the field: the
    decode worker read the prompt over NIXL, so it wrote none of it to a cache itself
    (`cache_creation_input_tokens` 0) where a colocated vLLM reports what it computed.
    `input_tokens` (the tokens neither read nor written) moves by the difference."""
    if isinstance(cache, int):
        cache = MessagesCache(cache, None)
    if not isinstance(usage, dict):
        return False
    patched = False
    for field, value in (("cache_read_input_tokens", cache.read), ("cache_creation_input_tokens", cache.created)):
        if value is None or not isinstance(usage.get(field), int):
            continue
        if isinstance(usage.get("input_tokens"), int):
            usage["input_tokens"] = max(0, usage["input_tokens"] + usage[field] - value)
        usage[field] = value
        patched = True
    return patched


def patch_messages_body(body: bytes, cache: MessagesCache | int | None) -> bytes:
    """A whole Messages reply with the prefill leg's cache counts."""
    if cache is None or (MESSAGES_MARKER not in body and CREATION_MARKER not in body):
        return body
    try:
        reply = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(reply, dict) or not patch_messages_usage(reply.get("usage"), cache):
        return body
    return orjson.dumps(reply)
