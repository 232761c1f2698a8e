"""OpenAI's completions (`POST /v1/completions`) through P/D: its request model and rules,
and its entry in the API table. Its legs are the generic ones (proxy/apis/legs.py), its
usage OpenAI's `prompt_tokens_details` (proxy/apis/usage.py); a list of prompts and `n`
fan out into one P/D request per choice (proxy/flow/fanout.py)."""

from __future__ import annotations

from functools import partial
from typing import Any

from proxy.apis import legs
from proxy.apis.api import Api
from proxy.apis.usage import cached_tokens_of, patch_body
from proxy.apis.validation import OpenAIRequest, TokenIds, validate
from proxy.errors import ProxyError


class CompletionRequest(OpenAIRequest):
    prompt: TokenIds | list[TokenIds] | str | list[str] | None = None
    n: int = 1  # vLLM's completions take no null here (chat does)
    logprobs: int | None = None
    echo: bool | None = False

    NUMBER_FIELDS = ("prompt_logprobs", "logprobs")

    @classmethod
    def raw_rules(cls, body: dict[str, Any]) -> None:
        prompt = body.get("prompt")
        if prompt is None or prompt == "":
            if body.get("prompt_embeds") is None:
                raise ProxyError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        if body.get("use_beam_search") and body.get("echo") and body.get("logprobs") is not None:
            raise ProxyError(
                400,
                "`echo` with `logprobs` is not supported with beam search because beam search "
                "does not compute prompt logprobs.",
                param="echo",
            )

    def decode_only_rules(self, body: dict[str, Any]) -> int | None:
        logprobs = self.logprobs
        if logprobs is not None and logprobs < 0 and logprobs != -1:
            raise ProxyError(400, "`logprobs` must be a positive value or -1.", param="logprobs")
        max_tokens = 16 if self.max_tokens is None else self.max_tokens  # vLLM's default for completions
        if max_tokens < 0 or (max_tokens == 0 and not self.echo):
            raise ProxyError(400, f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        if max_tokens == 0:  # with `echo`: the prompt only, which vLLM runs as one token
            max_tokens = 1
        return max_tokens


COMPLETIONS = Api(
    "completions",
    "/v1/completions",
    partial(validate, schema=CompletionRequest),
    partial(legs.prefill_body, chat=False),
    legs.decode_body,
    lambda body, params: legs.release_body(body, False, params),
    legs.decode_only_reason,
    cached_tokens_of,
    patch_body,
)
