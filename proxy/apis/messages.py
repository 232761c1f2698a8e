"""The Anthropic Messages API (`POST /v1/messages`) through P/D: its validation, legs, usage
and event stream, and its entry in the API table (`MESSAGES`).

vLLM 0.32 serves it by turning the request into a chat completion
(`AnthropicServingMessages.to_chat_completion_request`), `kv_transfer_params` included,
and its non-streamed reply carries the prefill's `kv_transfer_params` at the top level
(`AnthropicMessagesResponse.kv_transfer_params`); its request model even skips the
thinking-budget check for a leg with `do_remote_decode`, the P/D prefill leg. So the
legs are chat's:
- prefill: `max_tokens=1`, `stream=false`, `kv_transfer_params` = legs.PREFILL_KV_REQUEST
  (`thinking`, `system` and `tools` stay: they change the rendered prompt);
- decode: the client's request plus the returned `kv_transfer_params`;
- release: a one-token decode with them;
- render (cache-aware routing's token ids, proxy/routing/tokens.py): the client's
  request, not streamed.
The API has no `n` and no `seed`; the reply's `id` is chat's (`chatcmpl-<X-Request-Id>`),
the same on both legs. Stream events come after the engine's first output (vLLM emits
`message_start` with the chat stream's first chunk), so there is no preamble to wait out.

Errors the proxy answers itself are in OpenAI's format, as on its other endpoints; a
worker's own 4xx comes back as vLLM wrote it (Anthropic's `{"type": "error", ...}`).

Validation, by the rule of proxy/apis/validation.py: accept what vLLM 0.32's
`AnthropicMessagesRequest` accepts and refuse what it refuses, checking here only what the
prefill leg does not carry as sent (it has `max_tokens=1` and `stream=false`, and vLLM
skips its thinking-budget check on a prefill leg). Fields both legs carry (`messages`
content, `tools`, `thinking`'s shape, ...) are the prefill worker's to refuse. Unknown
fields pass through; vLLM ignores them.

Usage: the client gets the prefill leg's prefix-cache counts (proxy/apis/usage.py says
why), here `usage.cache_read_input_tokens` (with `--enable-prompt-tokens-details`), with
`input_tokens` counting only the tokens neither read from nor written to a cache, so
`input_tokens` moves by the difference. Its `cache_creation_input_tokens` (what the
request wrote to a prefix cache) is the prefill worker's too: the decode worker wrote
nothing it computed (0 through P/D against the prompt's cached blocks on a colocated
server). It is in the whole reply, and in a stream's `message_start` (`message.usage`)
and final `message_delta` (`usage`) events.

The stream, relayed event by event (proxy/apis/named_events.py): vLLM frames each event as
`event: <type>` and `data: <json>` lines; the stream ends with `message_stop` (no
`[DONE]`). Events pass through byte for byte, except that the usage in `message_start`
(`message.usage`) and `message_delta` (`usage`) gets the prefill leg's cache counts
(`cached_tokens` holds a MessagesCache; patch_messages_usage), and that a broken decode
stream ends with Anthropic's `error` event (`{"type": "error", "error": {"type":
"api_error", "message": ...}}`), which the anthropic client raises as an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.apis.api import Api
from proxy.apis.legs import PREFILL_KV_REQUEST, decode_body
from proxy.apis.named_events import NamedEventStream, event_bytes, parse_data, with_data
from proxy.apis.validation import first_error
from proxy.errors import ProxyError, anthropic_error_body

# --- the legs -----------------------------------------------------------------------------


def decode_only_reason(body: dict[str, Any]) -> str | None:
    """A grammar-constrained request is marked (as for chat, see proxy/apis/legs.py: prefilled
    by its decode worker only under `structured_outputs = "decode_only"`): vLLM turns an
    `output_config.format` with a `schema` into a `response_format`, and a `tool_choice`
    of type `any` or `tool` into a required or named chat `tool_choice`."""
    output_config = body.get("output_config")
    fmt = output_config.get("format") if isinstance(output_config, dict) else None
    if isinstance(fmt, dict) and fmt.get("schema"):  # `json_schema` in vLLM's model, by its alias
        return "structured_output"
    tool_choice = body.get("tool_choice")
    if body.get("tools") and isinstance(tool_choice, dict) and tool_choice.get("type") in ("any", "tool"):
        return "structured_output"
    return None


def _one_token(body: dict[str, Any]) -> dict[str, Any]:
    leg = dict(body)
    leg["max_tokens"] = 1
    leg["stream"] = False
    return leg


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    return decode_body(_one_token(body), dict(PREFILL_KV_REQUEST))


def render_body(body: dict[str, Any]) -> dict[str, Any]:
    """What `/v1/messages/render` gets for the prompt's token ids: the decode leg's body
    without `kv_transfer_params` (so both render the same prompt), not streamed."""
    leg = dict(body)
    leg["stream"] = False
    return leg


def release_body(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    """A one-token decode that makes a decode worker read (and so free) the prefill's KV."""
    return decode_body(_one_token(body), kv_transfer_params)


# --- validation ---------------------------------------------------------------------------


class ThinkingBudget(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    budget_tokens: int | None = None


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Any]
    max_tokens: int
    stream: bool | None = False
    thinking: ThinkingBudget | None = None
    kv_transfer_params: None = Field(None, description="Set by the proxy only.")


_COERCED = ("max_tokens", "stream")


def validate_messages(body: dict[str, Any]) -> MessagesRequest:
    """Checks `body` as vLLM would (ProxyError 400 if it would refuse it) and writes the
    coerced values back into it."""
    try:
        request = MessagesRequest.model_validate(body)
    except ValidationError as exc:
        raise first_error(exc) from None
    if request.max_tokens <= 0:
        raise ProxyError(
            400, "Invalid value for 'max_tokens': Value error, max_tokens must be positive", param="max_tokens"
        )
    thinking = request.thinking
    if (
        thinking is not None
        and thinking.type == "enabled"
        and thinking.budget_tokens is not None
        and thinking.budget_tokens >= request.max_tokens
    ):
        raise ProxyError(400, "thinking.budget_tokens must be less than max_tokens", param="thinking")
    for name in _COERCED:
        if name in body:
            body[name] = getattr(request, name)
    return request


# --- usage: usage.cache_read_input_tokens, cache_creation_input_tokens --------------------

MESSAGES_MARKER = b'"cache_read_input_tokens"'
CREATION_MARKER = b'"cache_creation_input_tokens"'


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


# --- the event stream ---------------------------------------------------------------------


class MessagesStream(NamedEventStream):
    __slots__ = ()

    def error_event(self, status: int, message: str) -> bytes:
        self._breaking()
        return event_bytes("error", {"type": "error", "error": {"type": "api_error", "message": message}})

    def _event(self, event: bytes) -> bytes:
        if self.cached_tokens is None or (MESSAGES_MARKER not in event and CREATION_MARKER not in event):
            return event
        parsed = parse_data(event)
        if parsed is None or not isinstance(parsed[1], dict):
            return event
        head, payload = parsed
        message = payload.get("message")
        usage = message.get("usage") if isinstance(message, dict) else payload.get("usage")
        if not patch_messages_usage(usage, self.cached_tokens):
            return event
        return with_data(head, payload)


# --- the entry ----------------------------------------------------------------------------


def _messages_stream(chunks: AsyncIterator[bytes], cached_tokens: int | None):
    stream = MessagesStream(cached_tokens)
    return stream.relay(chunks), stream.error_event


# No fan-out (no `n`), the context check on its `max_tokens` (vLLM's chat serving refuses
# one beyond the context), the proxy's own errors in Anthropic's format. Its token ids come from the worker's
# `/v1/messages/render`: its messages and `system` render through vLLM's own conversion to
# chat, which /tokenize does not offer.
MESSAGES = Api(
    "messages",
    "/v1/messages",
    validate_messages,
    prefill_body,
    decode_body,
    release_body,
    decode_only_reason,
    messages_cached_tokens_of,
    patch_messages_body,
    stream=_messages_stream,
    fans_out=False,
    limit_fields=("max_tokens",),
    render_path="/v1/messages/render",
    render_body=render_body,
    prefill_usage_of=messages_cache_of,
    error_body=anthropic_error_body,
)
