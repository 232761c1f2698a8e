"""The Anthropic Messages API (`POST /v1/messages`) through P/D: its legs.

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
"""

from __future__ import annotations

from typing import Any

from proxy.apis.legs import PREFILL_KV_REQUEST, decode_body


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
