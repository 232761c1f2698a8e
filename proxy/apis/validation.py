"""Validation of client request bodies, before any worker sees them: what every API shares
(the body read as JSON, the first pydantic error as a 400) and the rules completions and
chat share; each API's own rules are in its module (proxy/apis/completions.py,
proxy/apis/chat.py, proxy/apis/responses.py, proxy/apis/messages.py).

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
from typing import Annotated, Any, ClassVar

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


class OpenAIRequest(BaseModel):
    """The fields completions and chat share, as vLLM 0.32 types them. Each API's subclass
    adds its own fields and rules (proxy/apis/completions.py, proxy/apis/chat.py)."""

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

    # The fields vLLM's "before" validators refuse unless a number (a string is refused
    # before pydantic could coerce it).
    NUMBER_FIELDS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def raw_rules(cls, body: dict[str, Any]) -> None:
        """The API's own "before" validators on the raw body, ahead of the shared ones."""

    def decode_only_rules(self, body: dict[str, Any]) -> int | None:
        """The API's own decode-only rules (see `_decode_only_rules`); returns the
        `max_tokens` vLLM's SamplingParams gets, for the shared rules after them."""
        return self.max_tokens


# Fields whose coerced value replaces the client's (what vLLM would read).
_COERCED = (
    "stream",
    "max_tokens",
    "n",
    "temperature",
    "seed",
    "min_tokens",
    "prompt_logprobs",
    "logprobs",
    "top_logprobs",
    "echo",
    "max_completion_tokens",
    "use_beam_search",
)


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


def first_error(exc: ValidationError) -> ProxyError:
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


def validate(body: dict[str, Any], schema: type[OpenAIRequest]) -> OpenAIRequest:
    """Checks `body` as vLLM would (ProxyError 400 if it would refuse it) and writes the
    coerced values of the fields the proxy reads back into it. `schema`: the API's request
    model (proxy/apis/completions.py, proxy/apis/chat.py), whose own rules run in their
    place among the shared ones."""
    _raw_rules(body, schema)
    try:
        request = schema.model_validate(body)
    except ValidationError as exc:
        raise first_error(exc) from None
    if not request.use_beam_search:  # served decode-only (proxy/apis/legs.py): its worker checks it all
        _decode_only_rules(body, request)
    for name in _COERCED:
        if name in body:
            body[name] = getattr(request, name)
    if body.get("stream_options") is not None:
        body["stream_options"] = request.stream_options.model_dump(exclude_unset=True)
    return request


def _raw_rules(body: dict[str, Any], schema: type[OpenAIRequest]) -> None:
    """vLLM's "before" validators that look at raw values (a string where a number
    belongs is refused before pydantic could coerce it): the API's own, then these."""
    schema.raw_rules(body)
    for name in schema.NUMBER_FIELDS:
        value = body.get(name)
        if value is not None and not isinstance(value, (int, float)):
            raise ProxyError(400, f"`{name}` must be an integer.", param=name)
    if body.get("stream_options") and not body.get("stream"):
        raise ProxyError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")


def _decode_only_rules(body: dict[str, Any], request: OpenAIRequest) -> None:
    """vLLM 0.32's request-model rules (`check_logprobs`) and its SamplingParams rules on
    `n`, `min_tokens` and `logprobs`, for the fields only the decode leg carries; messages
    as vLLM words them. The API's own (`decode_only_rules`) run between the shared ones."""
    prompt_logprobs = request.prompt_logprobs
    if prompt_logprobs is not None:
        if body.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise ProxyError(400, "`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise ProxyError(400, "`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs")
    max_tokens = request.decode_only_rules(body)
    n = 1 if request.n is None else request.n
    if n < 1:
        raise ProxyError(400, f"n must be at least 1, got {n}.", param="n")
    if request.min_tokens < 0:
        raise ProxyError(
            400, f"min_tokens must be greater than or equal to 0, got {request.min_tokens}.", param="min_tokens"
        )
    if request.temperature == 0 and n > 1:
        raise ProxyError(400, f"n must be 1 when using greedy sampling, got {n}.", param="n")
    if max_tokens is not None and request.min_tokens > max_tokens:
        raise ProxyError(
            400,
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {request.min_tokens}.",
            param="min_tokens",
        )
