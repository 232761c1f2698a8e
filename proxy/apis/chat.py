"""OpenAI's chat completions (`POST /v1/chat/completions`) through P/D: its request model and
rules, and its entry in the API table. Its legs are the generic ones (proxy/apis/legs.py,
with `max_completion_tokens` capped too), its usage OpenAI's `prompt_tokens_details`
(proxy/apis/usage.py); `n` fans out into one P/D request per choice (proxy/flow/fanout.py)."""

from __future__ import annotations

from functools import partial
from typing import Any

from pydantic import BaseModel, ConfigDict

from proxy.apis import legs
from proxy.apis.api import Api
from proxy.apis.usage import cached_tokens_of, patch_body
from proxy.apis.validation import OpenAIRequest, validate
from proxy.errors import ProxyError


class ChatMessage(BaseModel):
    """vLLM takes any role (its custom message type), and content of any shape its chat
    template renders; the role must be a string."""

    model_config = ConfigDict(extra="allow")
    role: str


class ChatCompletionRequest(OpenAIRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    echo: bool = False

    NUMBER_FIELDS = ("prompt_logprobs", "top_logprobs")

    @classmethod
    def raw_rules(cls, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if isinstance(messages, list) and any(not isinstance(m, dict) for m in messages):
            raise ProxyError(400, "Invalid value for 'messages': each message must be an object.", param="messages")

    def decode_only_rules(self, body: dict[str, Any]) -> int | None:
        top_logprobs = self.top_logprobs
        if top_logprobs is not None:
            if top_logprobs < 0 and top_logprobs != -1:
                raise ProxyError(400, "`top_logprobs` must be a positive value or -1.", param="top_logprobs")
            if (top_logprobs == -1 or top_logprobs > 0) and not body.get("logprobs"):
                raise ProxyError(
                    400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs"
                )
        max_field = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
        max_tokens = getattr(self, max_field)  # as vLLM's chat serving picks it
        if max_tokens is not None and max_tokens < 1:
            raise ProxyError(400, f"max_tokens must be at least 1, got {max_tokens}.", param=max_field)
        return max_tokens


CHAT = Api(
    "chat",
    "/v1/chat/completions",
    partial(validate, schema=ChatCompletionRequest),
    partial(legs.prefill_body, chat=True),
    legs.decode_body,
    lambda body, params: legs.release_body(body, True, params),
    legs.decode_only_reason,
    cached_tokens_of,
    patch_body,
    chat=True,
)
