"""Plain ASGI for the hot path: reading a request, sending a reply, noticing a client
that went away. The OpenAI endpoints use these instead of FastAPI's request handling,
which alone cost more per request than both worker legs (loadtest/micro/proxy_bench.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import ProxyError, error_body

Scope = dict
Receive = Callable
Send = Callable


def header(scope: Scope, name: bytes) -> str | None:
    """One request header (`name` in lower case), decoded as latin-1."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProxyError(413, f"Request body is larger than {limit} bytes.")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ProxyError(499, "Client closed the request.", code="client_closed_request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ProxyError(413, f"Request body is larger than {limit} bytes.")
        chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


@dataclass
class Reply:
    """What an endpoint answers: a whole body, or a stream of chunks."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    stream: AsyncIterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    closer: Any = None  # has close(): frees what a stream holds if it is never sent whole

    @classmethod
    def error(cls, exc: ProxyError, request_id: str | None, body_of: Callable[..., dict] = error_body) -> Reply:
        """`exc` as a reply; `body_of(status, message, param, code)` writes its body (OpenAI's
        format unless the endpoint's API has its own)."""
        body = json.dumps(body_of(exc.status, exc.message, exc.param, exc.code)).encode()
        headers = dict(exc.headers)
        if request_id:
            headers["X-Request-Id"] = request_id
        return cls(exc.status, body, headers=headers)


async def send_reply(send: Send, reply: Reply) -> None:
    headers = [(b"content-type", reply.content_type.encode("latin-1"))]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    if reply.stream is None:
        headers.append((b"content-length", b"%d" % len(reply.body)))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body})
        return
    headers.append((b"cache-control", b"no-cache"))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    try:
        async for chunk in reply.stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        # A client gone mid-stream leaves the generator suspended at a yield: close it
        # now, so what it runs (the merged stream's per-choice readers) ends with it.
        aclose = getattr(reply.stream, "aclose", None)
        if aclose is not None:
            await aclose()


CONNECTION_EXTENSION = "pdspec.connection"  # scope["extensions"] key of the request's `ClientConnection`


class ClientConnection:
    """What the server protocol (proxy/edge/connections.py) tells a request about its
    connection, in `scope["extensions"][CONNECTION_EXTENSION]`: `lost()` runs the callbacks
    registered with `on_lost` when the connection goes (each at most once). A request
    registers while it waits for its reply and unregisters when the reply is sent, so a
    kept-alive connection holds nothing of the requests it served."""

    __slots__ = ("is_lost", "_callbacks")

    def __init__(self) -> None:
        self.is_lost = False
        self._callbacks: set[Callable[[], None]] = set()

    def on_lost(self, callback: Callable[[], None]) -> None:
        if self.is_lost:
            callback()
        else:
            self._callbacks.add(callback)

    def forget(self, callback: Callable[[], None]) -> None:
        self._callbacks.discard(callback)

    def lost(self) -> None:
        self.is_lost = True
        callbacks, self._callbacks = self._callbacks, set()
        for callback in callbacks:
            callback()


class DisconnectWatch:
    """Cancels the request's task if its client disconnects before the reply is sent.

    Under the proxy's own server protocol the request's `ClientConnection` calls back when
    the connection is lost: nothing runs per request but a set insertion. Under any other
    ASGI server, one watcher task per request waits on `receive()`. Either way, cancelling
    the request's own task unwinds its worker calls, whose connections close, so vLLM
    aborts them and frees their KV blocks. Use after the body was read, and send through
    `watch.send`: once the last byte is handed over, the end of the connection is no longer
    a disconnect.

    The watcher task is never cancelled: the server wakes it when the response completes,
    and it ends normally. (Cancelling it made a garbage cycle per request, and the garbage
    collector's passes over them were most of the proxy's p99 under load.)"""

    __slots__ = ("receive", "_send", "disconnected", "finished", "_task", "_watcher", "_connection")

    def __init__(self, receive: Receive, send: Send, connection: ClientConnection | None = None) -> None:
        self.receive = receive
        self._send = send
        self.disconnected = False
        self.finished = False
        self._task = asyncio.current_task()
        self._connection = connection
        if connection is not None:
            self._watcher = None
            connection.on_lost(self._lost)
        else:
            self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while not self.finished:
            if (await self.receive())["type"] == "http.disconnect":
                break
        self._lost()

    def _lost(self) -> None:
        if not self.finished:
            self.disconnected = True
            self._task.cancel()
        self._task = None

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.finished = True
        await self._send(message)

    def stop(self) -> None:
        """The reply is sent, or will be sent by the caller: no cancelling from now on."""
        self.finished = True
        if self._connection is not None:
            self._connection.forget(self._lost)
            self._connection = None
            self._task = None
