"""HTTP/1.1 client for the proxy's calls to workers: a keep-alive connection pool per
worker, on asyncio protocols with httptools (the parser uvicorn uses).

Why not aiohttp or httpx: every client request costs the proxy two worker requests, and
on one core aiohttp's per-request cost capped the whole proxy near 3,300 req/s even
with nothing else in the path (this client: 14,800; see loadtest/results/proxy_bench.md).
The parser, the hard part, is httptools; this module only keeps connections.

What callers get:
- `await client.request(origin, method, path, body, headers, timeout_s)` returns once the
  status and headers are in (so a status can be checked before anything is relayed);
- `await response.read()` or `async for chunk in response.iter_chunks()` for the body;
- `response.release()` when done: a complete keep-alive response returns its connection
  to the pool; anything else closes it, which is how vLLM learns its caller went away
  (it aborts the request and frees its KV blocks).
Errors are `UpstreamError` with a short `reason` for metrics. A reused idle connection
that the worker had closed meanwhile is retried once on a new one, before any byte of
the request could have been processed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import httptools

# Stop reading from a worker while this much of its body waits for a slow client.
_HIGH_WATER = 256 * 1024
_IDLE_PER_ORIGIN = 256


class UpstreamError(Exception):
    """A worker call failed: `reason` is one of connect_error, timeout, connection_reset,
    protocol_error."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class UpstreamResponse:
    """One response, fed by its connection; the body is read once, whole or in chunks."""

    __slots__ = ("status", "headers", "complete", "_connection", "_pool", "_chunks", "_buffered", "_keep_alive",
                 "_error", "_waiter", "_headers_in", "_timer", "_released")  # fmt: skip

    def __init__(self, connection: _Connection, pool: _OriginPool) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self._connection = connection
        self._pool = pool
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._keep_alive = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future | None = None
        self._headers_in = False
        self._timer: asyncio.TimerHandle | None = None
        self._released = False

    # --- fed by the connection ---------------------------------------------------------

    def _on_headers(self, status: int) -> None:
        self.status = status
        self._headers_in = True
        self._wake()

    def _on_body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER:
            self._connection.transport.pause_reading()
        self._wake()

    def _on_complete(self, keep_alive: bool) -> None:
        self.complete = True
        self._keep_alive = keep_alive
        self._cancel_timer()
        self._wake()

    def _on_error(self, error: UpstreamError) -> None:
        if not self.complete and self._error is None:
            self._error = error
            self._cancel_timer()
            self._wake()

    def _on_timeout(self) -> None:
        self._timer = None
        self._on_error(UpstreamError("timeout", "worker did not answer in time"))
        self._connection.abort()

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

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self) -> bytes:
        while not self.complete:
            await self._wait()
        body = b"".join(self._chunks)
        self._chunks.clear()
        self.release()
        return body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (a stream's events), then releases the connection."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._buffered <= _HIGH_WATER // 2:
                    self._connection.resume_reading()
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
        self._cancel_timer()
        if self.complete and self._keep_alive and self._error is None:
            self._pool.put(self._connection)
        else:
            self._connection.abort()

    def close(self) -> None:
        """Drop the connection whatever its state (the worker sees its client leave)."""
        self._released = True
        self._cancel_timer()
        self._connection.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Connection(asyncio.Protocol):
    __slots__ = ("loop", "transport", "parser", "response", "closed", "bytes_received")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.bytes_received = 0

    # asyncio protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.bytes_received += len(data)
        if self.response is None:  # bytes nobody asked for: the connection is unusable
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.response._on_error(UpstreamError("protocol_error", f"bad HTTP from worker: {exc}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is None or response.complete:
            return
        if response._headers_in and not _has_length(response.headers):
            response._on_complete(keep_alive=False)  # a body delimited by the close
        else:
            response._on_error(UpstreamError("connection_reset", "worker closed the connection"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.response._on_headers(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.response._on_body(body)

    def on_message_complete(self) -> None:
        self.response._on_complete(self.parser.should_keep_alive())

    # helpers
    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()


def _has_length(headers: dict[str, str]) -> bool:
    return "content-length" in headers or "chunked" in headers.get("transfer-encoding", "")


class _OriginPool:
    def __init__(self, origin: str, connect_timeout_s: float) -> None:
        parts = urlsplit(origin)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"worker URL must be http://host:port, got {origin!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.host_header = parts.netloc.encode("latin-1")
        self.connect_timeout_s = connect_timeout_s
        self.idle: deque[_Connection] = deque()

    def put(self, connection: _Connection) -> None:
        connection.response = None
        if connection.closed or len(self.idle) >= _IDLE_PER_ORIGIN:
            connection.abort()
        else:
            self.idle.append(connection)

    def take_idle(self) -> _Connection | None:
        while self.idle:
            connection = self.idle.pop()  # the most recent: least likely to have timed out
            if not connection.closed:
                return connection
        return None

    async def connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), self.host, self.port), self.connect_timeout_s
            )
        except asyncio.TimeoutError:
            raise UpstreamError("timeout", f"connect to {self.host}:{self.port} timed out") from None
        except OSError as exc:
            raise UpstreamError("connect_error", f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return connection

    def close(self) -> None:
        while self.idle:
            self.idle.pop().abort()


class UpstreamClient:
    """Connection pools keyed by origin (`http://host:port`)."""

    def __init__(self, connect_timeout_s: float = 5.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._pools: dict[str, _OriginPool] = {}

    def _pool(self, origin: str) -> _OriginPool:
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = _OriginPool(origin, self.connect_timeout_s)
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
        """`on_sent` is called once the request is on the wire (the worker may act on it)."""
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
            connection.response = response
            connection.bytes_received = 0
            if deadline is not None:
                response._timer = loop.call_at(deadline, response._on_timeout)
            connection.transport.write(message)
            if on_sent is not None:
                on_sent()
            try:
                while not response._headers_in:
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
