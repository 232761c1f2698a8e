"""HTTP/1.1 client for the proxy's calls to workers: a keep-alive connection pool per
worker, on asyncio protocols with httptools (llhttp, the parser uvicorn uses).

Why not aiohttp or httpx: every client request costs the proxy two worker requests, and
on one core aiohttp's per-request cost capped the whole proxy near 3,300 req/s even
with nothing else in the path (this client: 14,800; see loadtest/results/proxy_bench.md).
The parser, the hard part, is llhttp; this module keeps connections and decides, for
each one, when it may serve another request.

What callers get:
- `await client.request(origin, method, path, body, headers, timeout_s)` returns once the
  final status and headers are in (so a status can be checked before anything is
  relayed); interim replies (100 Continue, 103 Early Hints) are skipped;
- `await response.read()` or `async for chunk in response.iter_chunks()` for the body;
- `response.release()` when done: a complete keep-alive response returns its connection
  to the pool; anything else closes it, which is how vLLM learns its caller went away
  (it aborts the request and frees its KV blocks).

Guarantees (tested against h11 in tests/unit/proxy/upstream/test_client_h11.py):
- a connection's life is explicit: IDLE (pooled) -> SENT (request written, no final
  head yet) -> BODY -> DONE, or BROKEN from anywhere. It goes back to the pool only when
  DONE, keep-alive, reading is not paused and not one byte beyond the reply arrived;
  bytes while IDLE, or after the reply in the same segment (trailing garbage, a second
  response), break it, so no reply can ever be handed to the next request;
- a body that ends early is an error: a Content-Length or chunked body cut by EOF or a
  reset; a body without either ends at EOF, but not at a reset;
- reading pauses only while more than `_HIGH_WATER` of the body waits for a streaming
  consumer (`iter_chunks`) or for one to start, and resumes as it catches up, when
  `read()` starts, or when the reply is complete; a body read whole is bounded by
  `max_body_bytes` instead, the head by `max_header_bytes`;
- timeouts: `idle_timeout_s` between bytes (a stream may run as long as it keeps
  talking; time paused for a slow consumer does not count) and an optional total
  `timeout_s` per request.
Errors are `UpstreamError` (proxy/upstream/errors.py) with a short `reason` for metrics,
a connection reset before the request was written included (a dying worker resets what its
listen queue accepted; uvloop's transport would raise on the write), and `on_sent` is not
called then. A reused idle connection that the worker had closed meanwhile is retried once
on a new one, before any byte of the request could have been processed.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import httptools

from pdspec.settings import WorkerClientSettings
from proxy.upstream.errors import ExtraBytes, UpstreamError, body_too_large, empty_line, headers_too_large

# Stop reading from a worker while this much of its body waits for a slow streaming
# consumer; resume once it is down to half.
_HIGH_WATER = 256 * 1024
_LOW_WATER = _HIGH_WATER // 2
_IDLE_PER_ORIGIN = 256
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # the empty line that ends a head (llhttp takes bare LF too)

# Connection states.
IDLE, SENT, BODY, DONE, BROKEN = range(5)
# Body consumers.
_UNREAD, _READ, _STREAM = range(3)


class UpstreamResponse:
    """One response, fed by its connection; the body is read once, whole or in chunks."""

    __slots__ = (
        "status",
        "headers",
        "complete",
        "_connection",
        "_pool",
        "_chunks",
        "_buffered",
        "_error",
        "_waiter",
        "_consumer",
        "_released",
    )

    def __init__(self, connection: _Connection, pool: _OriginPool) -> None:
        self.status = 0  # set once the final head is in
        self.headers: dict[str, str] = {}
        self.complete = False
        self._connection = connection
        self._pool = pool
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future | None = None
        self._consumer = _UNREAD
        self._released = False

    # --- fed by the connection ---------------------------------------------------------

    def _on_body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._consumer == _READ:
            if self._buffered > self._pool.max_body_bytes:
                raise body_too_large(self._pool.max_body_bytes)
        elif self._buffered > _HIGH_WATER:  # a streaming consumer behind, or none yet
            self._connection.pause_reading()
        self._wake()

    def _on_complete(self) -> None:
        self.complete = True
        self._wake()

    def _on_error(self, error: UpstreamError) -> None:
        if not self.complete and self._error is None:
            self._error = error
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # --- used by callers -----------------------------------------------------------------

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = self._connection.loop.create_future()
        try:
            await self._waiter
        except asyncio.CancelledError:
            self.close()  # the caller is gone: so is the worker's request
            raise
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    async def read(self) -> bytes:
        """The whole body (at most `max_body_bytes`), then releases the connection."""
        self._consumer = _READ
        if self._buffered > self._pool.max_body_bytes:
            self.close()
            raise body_too_large(self._pool.max_body_bytes)
        self._connection.resume_reading()
        while not self.complete:
            await self._wait()
        body = b"".join(self._chunks)
        self._chunks.clear()
        self.release()
        return body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (a stream's events), then releases the connection."""
        self._consumer = _STREAM
        connection = self._connection
        if self._buffered > _HIGH_WATER:
            connection.pause_reading()
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if connection.paused and self._buffered <= _LOW_WATER:
                    connection.resume_reading()
                yield chunk
            elif self.complete:
                self.release()
                return
            else:
                await self._wait()

    def release(self) -> None:
        """Done with this response: keep the connection if it can serve another."""
        if self._released:
            return
        self._released = True
        connection = self._connection
        if self.complete and connection.reusable():
            self._pool.put(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Drop the connection whatever its state (the worker sees its client leave);
        once released, the connection is no longer this response's to drop."""
        if not self._released:
            self._released = True
            self._connection.close()


class _Connection(asyncio.Protocol):
    __slots__ = (
        "loop",
        "pool",
        "transport",
        "parser",
        "response",
        "state",
        "keep_alive",
        "close_delimited",
        "paused",
        "bytes_received",
        "head_bytes",
        "last_io",
        "idle_timeout_s",
        "deadline",
        "timer",
        "head_chunks",
        "interim_offset",
        "await_status_line",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: _OriginPool) -> None:
        self.loop = loop
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.state = IDLE
        self.keep_alive = False
        self.close_delimited = False
        self.paused = False
        self.bytes_received = 0
        self.head_bytes = 0
        self.last_io = 0.0
        self.idle_timeout_s: float | None = None
        self.deadline: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        # The reply's segments until its final head (references): read after an interim reply.
        self.head_chunks: list[bytes] = []
        self.interim_offset = 0
        self.await_status_line = False

    # --- one exchange ---------------------------------------------------------------------

    def send(self, message: bytes, response: UpstreamResponse, deadline: float | None) -> bool:
        """Writes the request for `response`; False, writing nothing, if the connection was
        reset or is closing since it was made or pooled (its connection_lost has come or is
        due: uvloop's transport would raise on the write, asyncio's would drop it)."""
        if self.state == BROKEN or self.transport.is_closing():
            self.close()
            return False
        self.state = SENT
        self.response = response
        self.bytes_received = 0
        self.head_bytes = 0
        self.head_chunks = []
        self.interim_offset = 0
        self.await_status_line = True
        self.keep_alive = False
        self.close_delimited = False
        self.last_io = now = self.loop.time()
        self.idle_timeout_s = idle = self.pool.idle_timeout_s
        self.deadline = deadline
        if idle is not None or deadline is not None:
            self.timer = self.loop.call_at(
                _earliest(now + idle if idle is not None else None, deadline), self._on_timer
            )
        self.transport.write(message)
        return True

    def reusable(self) -> bool:
        return self.state == DONE and self.keep_alive and not self.paused

    # --- asyncio protocol --------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state != SENT and state != BODY:
            # Bytes nobody asked for: while pooled, or after the reply was complete.
            self.close()
            return
        self.last_io = self.loop.time()
        if state == SENT:
            # A status line is due (first, and after an interim reply): llhttp skips CR/LF, h11 refuses it.
            if self.await_status_line and data[0] in b"\r\n":
                self._fail(empty_line())
                return
            self.await_status_line = False
            self.head_chunks.append(data)
        self.bytes_received += len(data)
        try:
            # llhttp skips CR and LF between messages without a callback, so a segment
            # ending in one is fed in two steps: a reply complete before its last byte
            # had something after it.
            if data[-1] in b"\r\n" and len(data) > 1:
                view = memoryview(data)
                self.parser.feed_data(view[:-1])
                if self.state == DONE:
                    self._extra_bytes()
                    return
                self.parser.feed_data(view[-1:])
            else:
                self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("protocol_error", "worker switched protocols unasked"))
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if self.state == DONE:  # a second message or garbage after the reply
                self._extra_bytes()
            elif isinstance(cause, UpstreamError):
                self._fail(cause)
            else:
                self._fail(UpstreamError("protocol_error", f"bad HTTP from worker: {exc}"))
            return
        if self.state == SENT and self.bytes_received > self.pool.max_header_bytes:
            self._fail(headers_too_large(self.pool.max_header_bytes))

    def connection_lost(self, exc: Exception | None) -> None:
        state = self.state
        self.state = BROKEN
        self._cancel_timer()
        response = self.response
        if state == BODY and exc is None and self.close_delimited:
            response._on_complete()  # a body without a length ends when the worker closes
        elif state == SENT or state == BODY:
            what = "reset the connection" if exc is not None else "closed the connection"
            response._on_error(UpstreamError("connection_reset", f"worker {what} before its reply was complete"))

    # --- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.state == DONE:
            raise ExtraBytes

    def _after_interim(self) -> None:
        """An interim reply's head is complete: the final status line must follow at once, as
        before the first reply (data_received). Rare: the proxy never asks for 100 Continue."""
        received = b"".join(self.head_chunks)
        end = _HEAD_END.search(received, self.interim_offset)
        if end is None:  # cannot happen: llhttp saw this head end in these bytes
            return
        self.interim_offset = end.end()
        if self.interim_offset == len(received):
            self.await_status_line = True  # what follows comes in the next segment
        elif received[self.interim_offset] in b"\r\n":
            raise empty_line()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > self.pool.max_header_bytes:
            raise headers_too_large(self.pool.max_header_bytes)
        self.response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        response = self.response
        if status < 200:
            if status == 101:
                raise UpstreamError("protocol_error", "worker switched protocols unasked")
            response.headers.clear()  # an interim reply: the final one follows
            self.head_bytes = 0
            self._after_interim()
            return
        self.head_chunks = []  # the final head: nothing more to look back at
        headers = response.headers
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            raise UpstreamError("protocol_error", f"unsupported transfer-encoding from worker: {coding}")
        self.close_delimited = coding is None and "content-length" not in headers and status != 204 and status != 304
        self.state = BODY
        response.status = status
        response._wake()

    def on_body(self, body: bytes) -> None:
        self.response._on_body(body)

    def on_message_complete(self) -> None:
        if self.state != BODY:
            return  # the end of an interim reply
        self.state = DONE
        keep_alive = self.parser.should_keep_alive()
        if keep_alive and "connection" in self.response.headers:
            # llhttp keeps an HTTP/1.0 reply with "Connection: keep-alive"; h11 does not,
            # nor do we. (Asked only here: the version costs a string format.)
            keep_alive = self.parser.get_http_version() == "1.1"
        self.keep_alive = keep_alive
        self._cancel_timer()
        if self.paused:  # nothing more is expected; reading on shows bytes that should not come
            self.resume_reading()
        self.response._on_complete()

    # --- flow control, timers, endings -------------------------------------------------------

    def pause_reading(self) -> None:
        if not self.paused and self.state == BODY:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            if self.state != BROKEN:
                self.last_io = self.loop.time()  # the pause was our consumer's, not the worker's
                self.transport.resume_reading()

    def _on_timer(self) -> None:
        self.timer = None
        if self.state != SENT and self.state != BODY:
            return
        now = self.loop.time()
        if self.deadline is not None and now >= self.deadline:
            self._fail(UpstreamError("timeout", "worker did not complete its reply in time"))
            return
        idle_until = None
        if self.idle_timeout_s is not None:
            if self.paused:
                idle_until = now + self.idle_timeout_s
            elif now - self.last_io >= self.idle_timeout_s:
                self._fail(UpstreamError("timeout", f"worker sent nothing for {self.idle_timeout_s:g} s"))
                return
            else:
                idle_until = self.last_io + self.idle_timeout_s
        self.timer = self.loop.call_at(_earliest(idle_until, self.deadline), self._on_timer)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _extra_bytes(self) -> None:
        """The reply is whole (its response keeps it) but the connection cannot serve another."""
        self.close()

    def _fail(self, error: UpstreamError) -> None:
        self.close()
        if self.response is not None:
            self.response._on_error(error)

    def close(self) -> None:
        self.state = BROKEN
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()


def _earliest(a: float | None, b: float | None) -> float:
    if a is None:
        return b
    return a if b is None or a < b else b


class _OriginPool:
    def __init__(self, origin: str, client: UpstreamClient) -> None:
        parts = urlsplit(origin)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"worker URL must be http://host:port, got {origin!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.host_header = parts.netloc.encode("latin-1")
        self.connect_timeout_s = client.connect_timeout_s
        self.idle_timeout_s = client.idle_timeout_s
        self.max_header_bytes = client.max_header_bytes
        self.max_body_bytes = client.max_body_bytes
        self.idle: deque[_Connection] = deque()

    def put(self, connection: _Connection) -> None:
        connection.response = None
        if connection.state != DONE or len(self.idle) >= _IDLE_PER_ORIGIN:
            connection.close()
        else:
            connection.state = IDLE
            self.idle.append(connection)

    def take_idle(self) -> _Connection | None:
        while self.idle:
            connection = self.idle.pop()  # the most recent: least likely to have timed out
            if connection.state == IDLE:
                return connection
        return None

    async def connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop, self), self.host, self.port), self.connect_timeout_s
            )
        except asyncio.TimeoutError:
            raise UpstreamError("timeout", f"connect to {self.host}:{self.port} timed out") from None
        except OSError as exc:
            raise UpstreamError("connect_error", f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return connection

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class UpstreamClient:
    """Connection pools keyed by origin (`http://host:port`).

    `idle_timeout_s`: longest silence from a worker while a reply is due (before its
    head and between any two bytes); None: no limit. A non-streamed reply says nothing
    until it is done, so for those it bounds the whole generation."""

    def __init__(
        self,
        connect_timeout_s: float = 5.0,
        idle_timeout_s: float | None = 300.0,
        max_header_bytes: int = 64 * 1024,
        max_body_bytes: int = 128 * 1024 * 1024,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self._pools: dict[str, _OriginPool] = {}

    @classmethod
    def from_settings(cls, settings: WorkerClientSettings) -> UpstreamClient:
        """The client the `worker_client` group describes (its leg deadlines and key are the flow's)."""
        return cls(
            settings.connect_timeout_s, settings.idle_timeout_s, settings.max_header_bytes, settings.max_body_bytes
        )

    def _pool(self, origin: str) -> _OriginPool:
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = _OriginPool(origin, self)
        return pool

    async def request(
        self,
        origin: str,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        on_sent: Callable[[], None] | None = None,
    ) -> UpstreamResponse:
        """`timeout_s`: total for the whole reply (None: only the idle timeout applies).
        `on_sent` is called once the request is on the wire (the worker may act on it)."""
        pool = self._pool(origin)
        loop = asyncio.get_running_loop()
        head = [f"{method} {path} HTTP/1.1\r\nHost: ".encode("latin-1"), pool.host_header, b"\r\n"]
        if body is not None:
            head.append(b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body))
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"\r\n")
        if body:
            head.append(body)
        message = b"".join(head)
        deadline = None if timeout_s is None else loop.time() + timeout_s

        connection = pool.take_idle()
        reused = connection is not None
        while True:
            if connection is None:
                connection = await pool.connect(loop)
            response = UpstreamResponse(connection, pool)
            if not connection.send(message, response, deadline):
                # Reset before anything was written (a dying worker resets what its listen
                # queue accepted): nothing reached the worker; a pooled one is replaced once.
                if reused:
                    connection, reused = None, False
                    continue
                raise UpstreamError("connection_reset", "worker reset the connection before the request")
            if on_sent is not None:
                on_sent()
            try:
                while not response.status:
                    await response._wait()
            except UpstreamError as exc:
                response.close()
                # A kept-alive connection the worker closed while it sat idle: it never
                # read this request, so sending it again on a new connection is safe.
                if reused and exc.reason == "connection_reset" and connection.bytes_received == 0:
                    connection, reused = None, False
                    continue
                raise
            return response

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
