"""Validation of `/v1/responses` bodies, by the rule of proxy/apis/validation.py: accept what
vLLM 0.32's `ResponsesRequest` accepts and refuse what it refuses, checking here only what
a worker would check too late, that is what the prefill leg does not carry as the
client sent it (proxy/apis/responses.py sets `max_output_tokens=1`, `stream=false`,
`store=false` and drops `seed`). Unknown fields pass through as vLLM takes them (its
request model allows extra fields and ignores them); fields both legs carry (`input`
items, `tools`, `include`, `temperature`, ...) are the prefill worker's to refuse, before
it pins anything.

On top of vLLM's rules, the stateful options are refused (proxy/apis/responses.py says why).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.apis.responses import refuse_stateful
from proxy.apis.validation import Int64, _first_error
from proxy.errors import ProxyError


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
        raise _first_error(exc) from None
    # vLLM's before-validator, on the raw values: background needs store.
    if body.get("background") and not body.get("store", True):
        raise ProxyError(400, "background can only be used when `store` is true", param="background")
    refuse_stateful(request.model_dump(include={"previous_response_id", "background"}))
    # SamplingParams' rule, which vLLM applies to min(max_output_tokens, what the context leaves).
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise ProxyError(400, f"max_tokens must be at least 1, got {request.max_output_tokens}.",
                         param="max_output_tokens")  # fmt: skip
    for name in _COERCED:
        if name in body:
            body[name] = getattr(request, name)
    return request
