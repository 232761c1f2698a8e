"""Validation of client request bodies, before any worker sees them.

The rule: the proxy accepts what vLLM accepts and refuses what it refuses, with the same
status class and OpenAI's error shape (tests/unit/proxy/apis/test_validation_differential.py checks
it against vLLM's own request classes over generated bodies). So the fields checked here
are typed as vLLM 0.32 types them, in pydantic's lax mode as vLLM's are (`"max_tokens":
4.0` is 4, `"stream": "true"` is true), and the coerced values are written back into
the body, so the proxy's own logic and both legs read what vLLM would. Other fields pass
through untouched, so new OpenAI/vLLM options keep working, and the workers check them.

A field is checked here only when a worker would check it too late. That is what the
prefill leg does not carry (proxy/apis/legs.py drops `stream_options`, `min_tokens`,
`logprobs`, `top_logprobs`, `echo`, `prompt_logprobs` and `seed`, and sets
`max_tokens=1`, `stream=false`, `n=1`): vLLM checks those only on the decode leg, after
the prefill worker has computed the prompt and pinned its KV. vLLM's cross-field rules on
them are applied up front too (`_decode_only_rules`), on the raw body as vLLM's
"before" validators see it, with vLLM's messages. Fields both legs carry (temperature,
top_p, stop, ...) are the prefill worker's to refuse: a refused prefill pins nothing.

The one deliberate difference: `kv_transfer_params` is the proxy's to set, never a
client's (it names where a decode worker pulls KV from).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.errors import ProxyError

Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
TokenIds = list[Annotated[int, Field(ge=0)]]
# Deeper JSON than this is refused: orjson, which writes the legs, cannot serialize more
# than 254 levels, and the legs nest the client's body one level deeper.
MAX_JSON_DEPTH = 200


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    n: int | None = 1
    temperature: float | None = None
    kv_transfer_params: None = Field(None, description="Set by the proxy only.")
    # Not on the prefill leg (see the module's docstring): typed as vLLM types them.
    seed: Int64 | None = None
    min_tokens: int = 0
    prompt_logprobs: int | None = None
    use_beam_search: bool = False


class CompletionRequest(_Common):
    prompt: TokenIds | list[TokenIds] | str | list[str] | None = None
    n: int = 1  # vLLM's completions take no null here (chat does)
    logprobs: int | None = None
    echo: bool | None = False


class ChatMessage(BaseModel):
    """vLLM takes any role (its custom message type), and content of any shape its chat
    template renders; the role must be a string."""

    model_config = ConfigDict(extra="allow")
    role: str


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    echo: bool = False


# Fields whose coerced value replaces the client's (what vLLM would read).
_COERCED = ("stream", "max_tokens", "n", "temperature", "seed", "min_tokens", "prompt_logprobs", "logprobs",
            "top_logprobs", "echo", "max_completion_tokens", "use_beam_search")  # fmt: skip


def check_content_type(content_type: str | None) -> None:
    """JSON bodies only, as vLLM takes them: with no API keys set, a web page could make
    a browser POST a form or text/plain body to the proxy without a CORS preflight."""
    media_type = (content_type or "").lower().split(";", maxsplit=1)[0]
    if media_type != "application/json":
        raise ProxyError(400, "Unsupported Media Type: Only 'application/json' is allowed", param="content-type")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as vLLM reads it (FastAPI: Python's `json.loads` on the bytes): UTF-8, or
    UTF-8 with a byte order mark, UTF-16 or UTF-32 (told apart as `json.detect_encoding`
    does). Plain UTF-8 is parsed straight from the bytes; only a body orjson refuses is
    looked at again for another encoding."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        body = _parse_other_encoding(raw, exc)
    if not isinstance(body, dict):
        raise ProxyError(400, "Request body must be a JSON object.")
    # Nesting deeper than the limit needs more opening brackets than the limit: counted in
    # C over the raw bytes, so the walk below runs only for bodies that could be that deep.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _deeper_than(body, MAX_JSON_DEPTH):
        raise ProxyError(400, f"Request body is nested more than {MAX_JSON_DEPTH} levels deep.")
    return body


def _parse_other_encoding(raw: bytes, utf8_error: orjson.JSONDecodeError) -> Any:
    encoding = json.detect_encoding(raw)
    if encoding == "utf-8":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProxyError(400, "Request body is not valid UTF-8.") from None
        raise ProxyError(400, f"Request body is not valid JSON: {utf8_error.msg} at position {utf8_error.pos}.")
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError:
        raise ProxyError(400, f"Request body is not valid {encoding.upper()}.") from None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(400, f"Request body is not valid JSON: {exc.msg} at position {exc.pos}.") from None


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests containers more than `limit` deep; iterative, so no recursion
    limit applies. It looks at every item of every container (8 ms for a 100,000-token
    prompt), hence the bracket count before it."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


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
    """Checks `body` as vLLM would (ProxyError 400 if it would refuse it) and writes the
    coerced values of the fields the proxy reads back into it."""
    _raw_rules(body, schema is ChatCompletionRequest)
    try:
        request = schema.model_validate(body)
    except ValidationError as exc:
        raise _first_error(exc) from None
    if not request.use_beam_search:  # served decode-only (proxy/apis/legs.py): its worker checks it all
        _decode_only_rules(body, request)
    for name in _COERCED:
        if name in body:
            body[name] = getattr(request, name)
    if body.get("stream_options") is not None:
        body["stream_options"] = request.stream_options.model_dump(exclude_unset=True)
    return request


def _raw_rules(body: dict[str, Any], chat: bool) -> None:
    """vLLM's "before" validators that look at raw values (a string where a number
    belongs is refused before pydantic could coerce it)."""
    if chat:
        messages = body.get("messages")
        if isinstance(messages, list) and any(not isinstance(m, dict) for m in messages):
            raise ProxyError(400, "Invalid value for 'messages': each message must be an object.", param="messages")
        number_fields = ("prompt_logprobs", "top_logprobs")
    else:
        prompt = body.get("prompt")
        if prompt is None or prompt == "":
            if body.get("prompt_embeds") is None:
                raise ProxyError(400, "Either prompt or prompt_embeds must be provided and non-empty.",
                                 param="prompt")  # fmt: skip
        number_fields = ("prompt_logprobs", "logprobs")
        if body.get("use_beam_search") and body.get("echo") and body.get("logprobs") is not None:
            raise ProxyError(400, "`echo` with `logprobs` is not supported with beam search because beam search "
                                  "does not compute prompt logprobs.", param="echo")  # fmt: skip
    for name in number_fields:
        value = body.get(name)
        if value is not None and not isinstance(value, (int, float)):
            raise ProxyError(400, f"`{name}` must be an integer.", param=name)
    if body.get("stream_options") and not body.get("stream"):
        raise ProxyError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")


def _decode_only_rules(body: dict[str, Any], request: _Common) -> None:
    """vLLM 0.32's request-model rules (`check_logprobs`) and its SamplingParams rules on
    `n`, `min_tokens` and `logprobs`, for the fields only the decode leg carries; messages
    as vLLM words them."""
    prompt_logprobs = request.prompt_logprobs
    if prompt_logprobs is not None:
        if body.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise ProxyError(400, "`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise ProxyError(400, "`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs")
    if isinstance(request, ChatCompletionRequest):
        top_logprobs = request.top_logprobs
        if top_logprobs is not None:
            if top_logprobs < 0 and top_logprobs != -1:
                raise ProxyError(400, "`top_logprobs` must be a positive value or -1.", param="top_logprobs")
            if (top_logprobs == -1 or top_logprobs > 0) and not body.get("logprobs"):
                raise ProxyError(400, "when using `top_logprobs`, `logprobs` must be set to true.",
                                 param="top_logprobs")  # fmt: skip
        max_field = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        max_tokens = getattr(request, max_field)  # as vLLM's chat serving picks it
        if max_tokens is not None and max_tokens < 1:
            raise ProxyError(400, f"max_tokens must be at least 1, got {max_tokens}.", param=max_field)
    else:
        logprobs = request.logprobs
        if logprobs is not None and logprobs < 0 and logprobs != -1:
            raise ProxyError(400, "`logprobs` must be a positive value or -1.", param="logprobs")
        max_tokens = 16 if request.max_tokens is None else request.max_tokens  # vLLM's default for completions
        if max_tokens < 0 or (max_tokens == 0 and not request.echo):
            raise ProxyError(400, f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        if max_tokens == 0:  # with `echo`: the prompt only, which vLLM runs as one token
            max_tokens = 1
    n = 1 if request.n is None else request.n
    if n < 1:
        raise ProxyError(400, f"n must be at least 1, got {n}.", param="n")
    if request.min_tokens < 0:
        raise ProxyError(400, f"min_tokens must be greater than or equal to 0, got {request.min_tokens}.",
                         param="min_tokens")  # fmt: skip
    if request.temperature == 0 and n > 1:
        raise ProxyError(400, f"n must be 1 when using greedy sampling, got {n}.", param="n")
    if max_tokens is not None and request.min_tokens > max_tokens:
        raise ProxyError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                              f"got {request.min_tokens}.", param="min_tokens")  # fmt: skip
