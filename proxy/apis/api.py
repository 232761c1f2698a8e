"""The generation APIs the proxy serves through P/D (OpenAI completions, chat and
responses, Anthropic messages), each as a table of what differs: `Api`.

Disaggregator (proxy/flow/disagg.py) runs every API the same way (prefill leg, hand-off,
decode leg, release, failure handling, metrics); what it needs to know about one API is
its `Api`: how to validate a body, build its legs, tell what cannot be disaggregated, find
and patch `cached_tokens`, and relay its event stream. Each API's module builds its entry
(proxy/apis/completions.py, chat.py, responses.py, messages.py); proxy/apis/registry.py
lists them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from proxy.apis.limits import LIMITED_FIELDS
from proxy.apis.usage import patch_stream
from proxy.errors import error_body, sse_error_event

Body = dict[str, Any]


def _default_stream(chunks: AsyncIterator[bytes], cached_tokens: int | None):
    """The stream to send, and the event that ends it when the decode stream breaks."""
    return patch_stream(chunks, cached_tokens), sse_error_event


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
