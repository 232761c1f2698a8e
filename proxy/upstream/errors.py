"""The errors of the proxy's worker client (proxy/upstream/client.py): what a caller catches, and
the parser callbacks' signals."""

from __future__ import annotations


class UpstreamError(Exception):
    """A worker call failed: `reason` is one of connect_error, timeout, connection_reset,
    protocol_error, headers_too_large, body_too_large."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ExtraBytes(Exception):
    """Raised from a parser callback: a second message began after the reply."""


def body_too_large(limit: int) -> UpstreamError:
    return UpstreamError("body_too_large", f"worker reply over {limit} bytes")


def empty_line() -> UpstreamError:
    return UpstreamError("protocol_error", "worker reply has an empty line where a status line belongs")


def headers_too_large(limit: int) -> UpstreamError:
    return UpstreamError("headers_too_large", f"worker reply head over {limit} bytes")
