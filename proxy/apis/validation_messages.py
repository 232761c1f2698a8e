"""Validation of `/v1/messages` bodies, by the rule of proxy/apis/validation.py: accept what
vLLM 0.32's `AnthropicMessagesRequest` accepts and refuse what it refuses, checking here
only what the prefill leg does not carry as sent (proxy/apis/messages.py sets `max_tokens=1`
and `stream=false`, and vLLM skips its thinking-budget check on a prefill leg). Fields
both legs carry (`messages` content, `tools`, `thinking`'s shape, ...) are the prefill
worker's to refuse. Unknown fields pass through; vLLM ignores them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.apis.validation import _first_error
from proxy.errors import ProxyError


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
        raise _first_error(exc) from None
    if request.max_tokens <= 0:
        raise ProxyError(400, "Invalid value for 'max_tokens': Value error, max_tokens must be positive",
                         param="max_tokens")  # fmt: skip
    thinking = request.thinking
    if thinking is not None and thinking.type == "enabled" and thinking.budget_tokens is not None \
            and thinking.budget_tokens >= request.max_tokens:  # fmt: skip
        raise ProxyError(400, "thinking.budget_tokens must be less than max_tokens", param="thinking")
    for name in _COERCED:
        if name in body:
            body[name] = getattr(request, name)
    return request
