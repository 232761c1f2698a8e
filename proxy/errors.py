"""Errors in the OpenAI error format: {"error": {"message", "type", "param", "code"}}; on
the Anthropic Messages endpoint in Anthropic's: {"type": "error", "error": {"type",
"message"}} (`anthropic_error_body`)."""

from __future__ import annotations

import json
from http import HTTPStatus

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class ProxyError(Exception):
    """An error the proxy answers itself, with an HTTP status and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    error_type = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {
        "error": {
            "message": message,
            "type": error_type,
            "param": param,
            "code": code if code is not None else HTTPStatus(status).phrase.lower().replace(" ", "_"),
        }
    }


# Anthropic's error types by status (its API reference, "Errors"); 503 is its overload.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """An error as Anthropic's Messages API writes one (the anthropic client reads its
    `error.message`). vLLM writes its Messages errors in this frame too, with its own
    exception names as `type` ("BadRequestError") and OpenAI's frame for a body its request
    model refuses; Anthropic's own type names are what Anthropic's clients know."""
    error_type = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": error_type, "message": message}}


def error_response(error: ProxyError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        error_body(error.status, error.message, error.param, error.code),
        status_code=error.status,
        headers={**error.headers, **(headers or {})},
    )


def sse_error_data(status: int, message: str) -> bytes:
    """An error as one server-sent event."""
    return b"data: " + json.dumps(error_body(status, message)).encode() + b"\n\n"


def sse_error_event(status: int, message: str) -> bytes:
    """The events that end a stream that failed after it began."""
    return sse_error_data(status, message) + b"data: [DONE]\n\n"
