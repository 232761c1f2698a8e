"""Client connections with limits: the HTTP/1.1 server protocol the proxy runs under uvicorn.

uvicorn's httptools protocol has no limit on a request's head and no timeout before a
response has been sent, and llhttp (through httptools) joins a header's value piece by
piece, so its cost grows with the square of the header's size: one 256 MB header
blocked the event loop for a minute, long enough for the proxy's own health checks to
time out and eject every worker. This protocol is uvicorn's, plus, each from
`ClientLimits` (the settings' `clients` group):
- `max_header_bytes`: the request line and headers together; beyond it, 431 and close.
  It is checked on every chunk the socket hands over (at most 256 KiB on uvloop) before
  the parser sees it, up to the head's end (`\r\n\r\n`) when the chunk holds it: a head
  that arrives whole in one chunk is measured as exactly as one in many, and the parser
  never holds more of a head than the limit;
- `head_timeout_s`: from a request's first byte to the end of its head; then 408;
- `body_timeout_s`: from the end of the head to the end of the body; then 408 (or just
  close, if the app already began its reply);
- `idle_timeout_s`: a connection with no request under way (just opened, or kept alive
  after a reply) is closed after this long;
- `max_connections`: a connection beyond it is answered 503 at once and closed.
Each refusal is an OpenAI error body with `Connection: close`, counted in
`pdspec_proxy_client_refusals_total` by reason. Nothing here runs per byte: one counter
per chunk and a timer per phase.

A refusal closes in stages (RFC 9112 9.6): the reply, then the proxy's half of the
connection (FIN), then whatever the client still sends is read and dropped until it
closes its half, `REFUSAL_LINGER_S` passes or `REFUSAL_LINGER_BYTES` were dropped (a client
that keeps sending past that is cut off with a reset, as before). Closed at once, a socket with unread bytes
(the rest of an oversized head, a request sent before a 503) is reset, and a reset can
destroy the reply in the client's receive buffer before it reads it: the client saw
`Connection reset by peer` instead of the 431.

Replies leave in as few writes as the event loop allows (`CoalescingTransport`): uvicorn
writes a reply's head and its body separately, and on a loopback or a virtual machine each
write that wakes the client costs more than the proxy's own work on a small reply.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pdspec.settings import ClientSettings
from proxy.asgi import CONNECTION_EXTENSION, ClientConnection
from proxy.errors import error_body

# How long a refused connection is drained after its reply (see the module's docstring):
# long enough for a client to read the reply and close, short enough that a flood of
# refused connections holds few sockets.
REFUSAL_LINGER_S = 2.0
# ... and at most this much of what the client still sends is read (and dropped): more than
# the rest of any head a client means to send, bounded for one that never stops.
REFUSAL_LINGER_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ClientLimits:
    max_header_bytes: int
    head_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    max_connections: int

    @classmethod
    def from_settings(cls, settings: ClientSettings) -> ClientLimits:
        """The limits of the `clients` group (its request limits are the endpoint's)."""
        return cls(
            settings.max_header_bytes,
            settings.head_timeout_s,
            settings.body_timeout_s,
            settings.idle_timeout_s,
            settings.max_connections,
        )


def refusal(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response with an OpenAI error body that closes the connection."""
    body = json.dumps(error_body(status, message)).encode()
    phrase = {408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}[status]
    return (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


def head_part(tail: bytes, data: bytes) -> int:
    """How many bytes of `data` belong to a request head whose bytes so far end in `tail`
    (their last three): all of it, or up to and including the blank line that ends it."""
    end = (tail + data).find(b"\r\n\r\n")
    return len(data) if end < 0 else end + 4 - len(tail)


class CoalescingTransport:
    """A connection's transport whose writes within one step of the event loop leave as one
    write, once the step's ready callbacks have run (a call_soon): a reply's head with its
    body (uvicorn writes them one after the other), a stream's events that came in together.
    Under load the replies of many connections then leave together after the step that
    made them, rather than each waking its client in turn. Order is kept; `close()` writes
    what is held first; `abort()` and a closed transport drop it. Everything else is the
    transport's own."""

    __slots__ = ("transport", "_loop", "_held", "_eof")

    def __init__(self, transport, loop) -> None:
        self.transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._eof = False

    def write(self, data: bytes) -> None:
        if not data or self._eof:  # after write_eof: a refused connection's other replies are dropped
            return
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(data)

    def _flush(self) -> None:
        held = self._held
        if not held:
            return
        self._held = []
        if not self.transport.is_closing() and not self._eof:
            self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        self.transport.close()

    def write_eof(self) -> None:
        """The held writes, then the end of this side's stream (the rest is still read);
        later writes are dropped (the transport would raise on them)."""
        self._flush()
        self._eof = True
        self.transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self.transport.abort()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name, default=None):
        return self.transport.get_extra_info(name, default)

    def __getattr__(self, name):  # the rest of the transport's interface, used off the hot path
        return getattr(self.transport, name)


def limited_protocol(limits: ClientLimits, on_refusal: Callable[[str], None] = lambda reason: None) -> type:
    """uvicorn's httptools protocol class with `limits` applied (pass as uvicorn's `http`)."""

    # Refused connections still draining (`_refuse`): they hold no request, so they do not
    # count against max_connections (a flood of refused clients would otherwise refuse the
    # next good one for REFUSAL_LINGER_S).
    lingering = [0]

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.transport = CoalescingTransport(transport, self.loop)
            self._awaiting_head = True  # no request under way, or one whose head is not complete
            self._head_bytes = 0
            self._head_tail = b""
            self._phase_timer: asyncio.TimerHandle | None = None
            self._client_connection = ClientConnection()  # tells the requests when it is lost
            self._refused = False  # replied to and half-closed: what comes now is dropped
            self._dropped = 0  # bytes dropped since
            if len(self.connections) - lingering[0] > limits.max_connections:
                self._refuse(
                    503,
                    f"The proxy holds its maximum of {limits.max_connections} client connections.",
                    "too_many_connections",
                )
                return
            self._arm(limits.idle_timeout_s, self._idle_timeout)

        def connection_lost(self, exc) -> None:
            if getattr(self, "_refused", False):
                lingering[0] -= 1
                self._refused = False
            self._disarm()
            super().connection_lost(exc)
            self._client_connection.lost()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope["extensions"] = {CONNECTION_EXTENSION: self._client_connection}

        def data_received(self, data: bytes) -> None:
            if self._refused:
                self._dropped += len(data)
                if self._dropped > REFUSAL_LINGER_BYTES:
                    self._end_linger()
                return
            if self._awaiting_head:
                if self._head_bytes == 0:  # a request's first bytes: the head's clock starts
                    self._arm(limits.head_timeout_s, self._head_timeout)
                    self._head_tail = b""
                self._head_bytes += head_part(self._head_tail, data)
                self._head_tail = data[-3:]  # the head's end may straddle two chunks
                if self._head_bytes > limits.max_header_bytes:
                    self._refuse(
                        431, f"Request head is larger than {limits.max_header_bytes} bytes.", "header_too_large"
                    )
                    return
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._awaiting_head = False
            self._head_bytes = 0
            self._arm(limits.body_timeout_s, self._body_timeout)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._awaiting_head = True
            self._disarm()  # the reply may take as long as it takes; after it, uvicorn's keep-alive timer
            super().on_message_complete()

        # --- timers ---------------------------------------------------------------------

        def _arm(self, delay_s: float, callback) -> None:
            self._disarm()
            self._phase_timer = self.loop.call_later(delay_s, callback)

        def _disarm(self) -> None:
            timer = getattr(self, "_phase_timer", None)
            if timer is not None:
                timer.cancel()
                self._phase_timer = None

        def _idle_timeout(self) -> None:
            if self._awaiting_head and self._head_bytes == 0 and not self.transport.is_closing():
                self.transport.close()

        def _head_timeout(self) -> None:
            if self._awaiting_head:
                self._refuse(408, f"Request head not received within {limits.head_timeout_s:g} s.", "head_timeout")

        def _body_timeout(self) -> None:
            message = f"Request body not received within {limits.body_timeout_s:g} s."
            if self.cycle is not None and self.cycle.response_started:
                on_refusal("body_timeout")
                self.transport.close()
            else:
                self._refuse(408, message, "body_timeout")

        def _refuse(self, status: int, message: str, reason: str) -> None:
            """Reply `status` and close in stages: the reply and a FIN, then the client's
            bytes dropped until it closes, REFUSAL_LINGER_S passes or REFUSAL_LINGER_BYTES
            were dropped (a transport that cannot half-close is closed at once)."""
            if self._refused:
                return
            on_refusal(reason)
            self._disarm()
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True  # the app reads a disconnect; its own reply is not sent
                self.cycle.message_event.set()
                self._client_connection.lost()  # now, not at the close: its upstream legs are cancelled
            self.transport.write(refusal(status, message))
            if not self.transport.can_write_eof():
                self.transport.close()
                return
            self._refused = True
            lingering[0] += 1
            self.transport.write_eof()
            self._unset_keepalive_if_required()  # uvicorn's keep-alive timer would close it mid-drain
            self.flow.resume_reading()  # paused (a pipelined request, a buffered body), nothing is drained
            self._arm(REFUSAL_LINGER_S, self._end_linger)

        def _end_linger(self) -> None:
            # (A client that closes its half first ends it sooner: uvicorn's eof_received
            # returns None, so the transport closes itself.)
            if not self.transport.is_closing():
                self.transport.close()

    return LimitedHttpToolsProtocol
