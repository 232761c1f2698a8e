"""Validation of client request bodies, before any worker sees them.

Only the fields the proxy relies on (or that would make a worker fail late) are checked;
other fields pass through untouched, so new OpenAI/vLLM options keep working.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from proxy.errors import ProxyError

PositiveInt = Annotated[StrictInt, Field(ge=1)]
TokenIds = list[Annotated[StrictInt, Field(ge=0)]]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool | None = None


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


class CompletionRequest(_Common):
    prompt: Annotated[StrictStr, Field(min_length=1)] | list[StrictStr] | TokenIds | list[TokenIds]
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
        return schema.model_validate(body)
    except ValidationError as exc:
        raise _first_error(exc) from None
