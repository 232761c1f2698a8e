"""Server-sent event streams whose events have an `event:` line before their `data:` line
(the Responses and the Anthropic Messages APIs), relayed event by event.

The relay re-frames the decode worker's chunks on the blank lines that end events (one
network chunk can hold part of an event or several) and hands each whole event to
`_event`, which returns it unchanged or patched. When the decode stream breaks, the
proxy's own error event (`error_event`, the API's shape) ends the stream, and a
half-received event before it is dropped rather than sent cut off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

_DATA = b"data: "


class NamedEventStream:
    __slots__ = ("cached_tokens", "_broken")

    def __init__(self, cached_tokens: int | None) -> None:
        self.cached_tokens = cached_tokens  # the prefill leg's, for the usage in the stream
        self._broken = False

    def error_event(self, status: int, message: str) -> bytes:
        raise NotImplementedError

    def _event(self, event: bytes) -> bytes:
        return event

    def _breaking(self) -> None:
        """Called by `error_event`: the next chunk is the error, what is pending is cut off."""
        self._broken = True

    async def relay(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        pending = b""
        async for chunk in chunks:
            if self._broken:
                self._broken = False
                pending = b""
            pending += chunk
            if b"\n\n" not in pending:
                continue
            *events, pending = pending.split(b"\n\n")
            yield b"".join(self._event(event) + b"\n\n" for event in events)
        if pending:
            yield self._event(pending)


def event_bytes(kind: str, payload: dict) -> bytes:
    return b"event: " + kind.encode() + b"\n" + _DATA + orjson.dumps(payload) + b"\n\n"


def parse_data(event: bytes) -> tuple[bytes, Any] | None:
    """(the lines before the `data:` line, its parsed JSON) of one event, or None."""
    if event.startswith(_DATA):
        at = 0
    else:
        at = event.find(b"\n" + _DATA) + 1
        if at == 0:
            return None
    try:
        return event[:at], orjson.loads(event[at + len(_DATA) :])
    except orjson.JSONDecodeError:
        return None


def with_data(head: bytes, payload: Any) -> bytes:
    return head + _DATA + orjson.dumps(payload)
