"""Validation of client request bodies, before any worker sees them.

Only the fields the proxy relies on (or that would make a worker fail late) are checked;
other fields pass through untouched, so new OpenAI/vLLM options keep working.

"Fail late" matters most for what the prefill leg does not carry (proxy/legs.py drops
`stream_options`, `min_tokens`, `logprobs`, `top_logprobs`, `echo`, `prompt_logprobs` and
`seed`, and sets `max_tokens=1`, `stream=false`, `n=1`): vLLM checks those only on the
decode leg, after the prefill worker has computed the prompt and pinned its KV, and a
decode worker refusing the request in its request-model validation does not free that
KV (vLLM 0.32 frees it only for refusals in its serving layer). So those fields are typed
here as vLLM 0.32's protocol types them, and its cross-field rules on them are applied
up front (`_decode_only_rules`), as the same 400 vLLM would give.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from proxy.errors import ProxyError

PositiveInt = Annotated[StrictInt, Field(ge=1)]
Int64 = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
TokenIds = list[Annotated[StrictInt, Field(ge=0)]]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool | None = None
    continuous_usage_stats: StrictBool | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Annotated[StrictStr, Field(min_length=1)]
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    n: PositiveInt | None = 1
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    kv_transfer_params: None = Field(None, description="Set by the proxy only.")
    # Not on the prefill leg (see the module's docstring): typed as vLLM types them.
    seed: Int64 | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] = 0
    prompt_logprobs: StrictInt | None = None


class CompletionRequest(_Common):
    prompt: Annotated[StrictStr, Field(min_length=1)] | list[StrictStr] | TokenIds | list[TokenIds]
    n: PositiveInt = 1  # vLLM's completions take no null here (chat does)
    logprobs: Annotated[StrictInt, Field(ge=0)] | None = None
    echo: StrictBool | None = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: StrictStr | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: StrictBool | None = False
    top_logprobs: Annotated[StrictInt, Field(ge=0)] | None = None
    echo: StrictBool = False


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProxyError(400, "Request body is not valid UTF-8.") from None
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(400, f"Request body is not valid JSON: {exc.msg} at position {exc.pos}.") from None
    if not isinstance(body, dict):
        raise ProxyError(400, "Request body must be a JSON object.")
    return body


def _first_error(exc: ValidationError) -> ProxyError:
    error = exc.errors(include_url=False)[0]
    param = ".".join(str(part) for part in error["loc"]) or None
    message = error["msg"]
    if error["type"] == "missing":
        message = f"'{param}' is a required property"
    elif error["type"] == "none_required" and param == "kv_transfer_params":
        message = "'kv_transfer_params' is set by the proxy, not by clients"
    else:
        message = f"Invalid value for '{param}': {message}"
    return ProxyError(400, message, param=param)


def validate(body: dict[str, Any], schema: type[_Common]) -> _Common:
    try:
        request = schema.model_validate(body)
    except ValidationError as exc:
        raise _first_error(exc) from None
    _decode_only_rules(body, request)
    return request


def _decode_only_rules(body: dict[str, Any], request: _Common) -> None:
    """vLLM 0.32's request-model rules (`validate_stream_options`, `check_logprobs`) and
    its SamplingParams rule on `min_tokens`, for the fields only the decode leg carries;
    messages as vLLM words them."""
    if body.get("stream_options") and not body.get("stream"):
        raise ProxyError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    prompt_logprobs = request.prompt_logprobs
    if prompt_logprobs is not None:
        if request.stream and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise ProxyError(400, "`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise ProxyError(400, "`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs")
    if isinstance(request, ChatCompletionRequest):
        if request.top_logprobs and not request.logprobs:
            raise ProxyError(400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
        max_tokens = request.max_completion_tokens or request.max_tokens
    else:
        if body.get("use_beam_search") and request.echo and request.logprobs is not None:
            raise ProxyError(400, "`echo` with `logprobs` is not supported with beam search because beam search "
                                  "does not compute prompt logprobs.", param="echo")  # fmt: skip
        max_tokens = request.max_tokens
    if max_tokens is not None and request.min_tokens > max_tokens:
        raise ProxyError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                              f"got {request.min_tokens}.", param="min_tokens")  # fmt: skip
