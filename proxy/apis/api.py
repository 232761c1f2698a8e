"""The generation APIs the proxy serves through P/D (OpenAI completions, chat and
responses, Anthropic messages), each as a table of what differs.

Disaggregator (proxy/flow/disagg.py) runs every API the same way (prefill leg, hand-off,
decode leg, release, failure handling, metrics); what it needs to know about one API is
here: how to validate a body, build its legs, tell what cannot be disaggregated, find
and patch `cached_tokens`, and relay its event stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from proxy.apis import legs, messages, responses
from proxy.apis.limits import LIMITED_FIELDS
from proxy.apis.messages_stream import MessagesStream
from proxy.apis.responses_stream import PREAMBLE_EVENTS, ResponsesStream
from proxy.apis.usage import (
    cached_tokens_of,
    messages_cache_of,
    messages_cached_tokens_of,
    patch_body,
    patch_messages_body,
    patch_responses_body,
    patch_stream,
    responses_cached_tokens_of,
)  # fmt: skip
from proxy.apis.validation import ChatCompletionRequest, CompletionRequest, validate
from proxy.apis.validation_messages import validate_messages
from proxy.apis.validation_responses import validate_responses
from proxy.errors import anthropic_error_body, error_body, sse_error_event

Body = dict[str, Any]


def _default_stream(chunks: AsyncIterator[bytes], cached_tokens: int | None):
    """The stream to send, and the event that ends it when the decode stream breaks."""
    return patch_stream(chunks, cached_tokens), sse_error_event


def _responses_stream(chunks: AsyncIterator[bytes], cached_tokens: int | None):
    stream = ResponsesStream(cached_tokens)
    return stream.relay(chunks), stream.error_event


def _messages_stream(chunks: AsyncIterator[bytes], cached_tokens: int | None):
    stream = MessagesStream(cached_tokens)
    return stream.relay(chunks), stream.error_event


@dataclass(frozen=True, slots=True)
class Api:
    name: str  # the `endpoint` label of pdspec_proxy_requests_total, and the trace's
    path: str
    validate: Callable[[Body], Any]  # ProxyError 400, or the body coerced in place
    prefill_body: Callable[[Body], Body]
    decode_body: Callable[[Body, Body | None], Body]
    release_body: Callable[[Body, Body], Body]
    decode_only_reason: Callable[[Body], str | None]
    cached_tokens_of: Callable[[Body], int | None]  # the prefill's prefix-cache hits (admission counts them)
    # (decode body, the prefill's usage counts) -> the body the client gets
    patch_body: Callable[[bytes, Any], bytes]
    # (decode chunks, cached_tokens) -> (stream for the client, error_event(status, message))
    stream: Callable = _default_stream
    chat: bool = False  # the prompt is `messages` (for routing tokens)
    fans_out: bool = True  # `n` and lists of prompts: one prefill and decode per choice (proxy/flow/fanout.py)
    # Fields refused beyond the model's context, as vLLM refuses them (proxy/apis/limits.py).
    limit_fields: tuple[str, ...] = LIMITED_FIELDS
    # Cache-aware routing's token ids (proxy/routing/tokens.py): None reads them from the
    # body or /tokenize (completions, chat); else the worker's render endpoint at this
    # path, sent `render_body(body)`, the decode leg's body as it renders.
    render_path: str | None = None
    render_body: Callable[[Body], Body] | None = None
    preamble_events: int = 0  # stream events a decode worker sends before it reads the KV
    prepare: Callable[[Body, str], None] | None = None  # (body, request id), after validation
    # What patch_body and stream take from the prefill reply; None: cached_tokens_of's number.
    prefill_usage_of: Callable[[Body], Any] | None = None
    # The body of an error the proxy answers on this endpoint (proxy/errors.py).
    error_body: Callable[..., dict] = error_body


COMPLETIONS = Api(
    "completions", "/v1/completions", partial(validate, schema=CompletionRequest),
    partial(legs.prefill_body, chat=False), legs.decode_body,
    lambda body, params: legs.release_body(body, False, params),
    legs.decode_only_reason, cached_tokens_of, patch_body,
)  # fmt: skip
CHAT = Api(
    "chat", "/v1/chat/completions", partial(validate, schema=ChatCompletionRequest),
    partial(legs.prefill_body, chat=True), legs.decode_body,
    lambda body, params: legs.release_body(body, True, params),
    legs.decode_only_reason, cached_tokens_of, patch_body, chat=True,
)  # fmt: skip
# No fan-out (the API has no `n`); the context check on `max_output_tokens` (vLLM refuses
# one beyond `max_model_len` and caps one up to it at what the prompt leaves). Its token ids come from the worker's
# `/v1/responses/render`: its `input` items and `instructions` render through vLLM's
# Responses renderer, which /tokenize does not offer.
RESPONSES = Api(
    "responses", "/v1/responses", validate_responses, responses.prefill_body, responses.responses_decode_body,
    responses.release_body, responses.decode_only_reason, responses_cached_tokens_of, patch_responses_body,
    stream=_responses_stream, fans_out=False, limit_fields=("max_output_tokens",), render_path="/v1/responses/render",
    render_body=responses.render_body, preamble_events=PREAMBLE_EVENTS, prepare=responses.with_request_id,
)  # fmt: skip

# Anthropic's Messages: no fan-out (no `n`), the context check on its `max_tokens` (vLLM's
# chat serving refuses one beyond the context), the proxy's own errors in Anthropic's format. Its token ids come from the worker's
# `/v1/messages/render`: its messages and `system` render through vLLM's own conversion to
# chat, which /tokenize does not offer.
MESSAGES = Api(
    "messages", "/v1/messages", validate_messages, messages.prefill_body, legs.decode_body, messages.release_body,
    messages.decode_only_reason, messages_cached_tokens_of, patch_messages_body, stream=_messages_stream,
    fans_out=False, limit_fields=("max_tokens",), render_path="/v1/messages/render", render_body=messages.render_body,
    prefill_usage_of=messages_cache_of, error_body=anthropic_error_body,
)  # fmt: skip

APIS = (COMPLETIONS, CHAT, RESPONSES, MESSAGES)
