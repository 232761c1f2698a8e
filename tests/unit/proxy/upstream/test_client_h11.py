"""Differential tests of the proxy's worker client (proxy/upstream/client.py) against h11, the
HTTP/1.1 state machine under httpx and httpcore, as the reference.

Hypothesis generates response byte streams: Content-Length, chunked (the header in any
letter case, extensions, trailers), close-delimited and body-less replies, HTTP/1.0 and
1.1, interim 1xx replies before the final one, then trailing garbage, stray CRLFs or a
whole second response; each cut at any byte (then EOF, a reset, or silence until the
idle timeout) and split at random byte boundaries. Every stream goes through both:

- the client, through its real code path: `UpstreamClient.request` and `read()` or
  `iter_chunks()` on a `_Connection` whose transport is a fake that delivers the chunks
  like asyncio does (no data while paused, EOF or reset after the last one), with a tiny
  flow-control high-water mark so streaming consumers pause and resume all the time;
- h11, fed the same chunks.

They must agree on: error or not; status and body; whether the connection may serve
another request (h11: both sides DONE, keep-alive, no byte beyond the reply).
A smaller set runs over real sockets, and there a reused connection must answer the
next request with that request's own reply.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import deque
from dataclasses import dataclass

import h11
import pytest
import uvloop
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.upstream import client as upstream
from proxy.upstream.client import IDLE, UpstreamClient, UpstreamError, _Connection

ORIGIN = "http://worker.test:80"
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

# --- generated responses ------------------------------------------------------------------

# Drawn from small fixed sets: generation is most of a case's time.
NAMES = st.sampled_from(["Server", "date", "X-Request-Id", "content-type", "Link", "cache-control", "X-A-1"])
VALUES = st.sampled_from(["", "uvicorn", "a/b; q=1", "text/event-stream", "</s.css>; rel=preload", "x" * 40])
HEADERS = st.lists(st.tuples(NAMES, VALUES), max_size=3)
# "chunked" in each of its 128 letter cases.
CHUNKED_CASES = st.integers(0, 127).map(
    lambda bits: "".join(c.upper() if bits >> i & 1 else c for i, c in enumerate("chunked"))
)


@st.composite
def status_line(draw, version: str, status: int) -> bytes:
    reason = draw(st.sampled_from([" OK", " Whatever It Is", " ", ""]))
    return f"HTTP/{version} {status}{reason}\r\n".encode()


def head(line: bytes, headers: list[tuple[str, str]]) -> bytes:
    return line + b"".join(f"{n}: {v}\r\n".encode() for n, v in headers) + b"\r\n"


@st.composite
def interim(draw) -> bytes:
    status = draw(st.sampled_from([100, 102, 103]))
    return head(draw(status_line("1.1", status)), draw(HEADERS))


@st.composite
def chunked_body(draw, body: bytes) -> bytes:
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=4)))) if len(body) > 1 else []
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)]) if body[a:b]]
    out = []
    for piece in pieces:
        size = draw(st.sampled_from(["{:x}", "{:X}", "0{:x}"])).format(len(piece))
        extension = draw(st.sampled_from(["", ";a=b", ";name"]))
        out.append(f"{size}{extension}\r\n".encode() + piece + b"\r\n")
    trailers = draw(st.lists(st.tuples(NAMES, VALUES), max_size=2))
    out.append(b"0\r\n" + b"".join(f"{n}: {v}\r\n".encode() for n, v in trailers) + b"\r\n")
    return b"".join(out)


@st.composite
def final_response(draw) -> bytes:
    version = draw(st.sampled_from(["1.1", "1.1", "1.1", "1.0"]))
    status = draw(st.sampled_from([200, 200, 201, 204, 304, 400, 404, 500, 503]))
    bodiless = status in (204, 304)
    framings = ["length", "close"] + (["chunked", "chunked"] if version == "1.1" and not bodiless else [])
    framing = draw(st.sampled_from(framings))
    body = b"" if bodiless else draw(st.binary(max_size=120))
    headers = draw(HEADERS)
    connection = draw(st.sampled_from([None, None, "close", "Close", "keep-alive", "Keep-Alive"]))
    if connection:
        headers.append(("Connection", connection))
    payload = body
    if framing == "length":
        headers.append(("Content-Length", str(draw(st.integers(0, 9)) if bodiless else len(body))))
    elif framing == "chunked":
        headers.append(("Transfer-Encoding", draw(CHUNKED_CASES)))
        payload = draw(chunked_body(body))
    if len(headers) > 1:  # the framing header anywhere among the others
        headers.insert(draw(st.integers(0, len(headers) - 1)), headers.pop())
    return head(draw(status_line(version, status)), headers) + payload


@st.composite
def exchange(draw):
    """(chunks, ending, consumer): the bytes a worker sends, as the client receives them."""
    # (An empty line after an interim reply is rare here: random bytes below; the client
    # refuses it as h11 does, in the regression cases after this test.)
    wire = b"".join(draw(st.lists(interim(), max_size=2)))
    if draw(st.integers(0, 19)) == 0:
        wire += draw(st.binary(min_size=1, max_size=30))  # not HTTP at all
    else:
        wire += draw(final_response())
    wire += draw(
        st.one_of(
            st.just(b""),
            st.just(b""),
            st.just(b""),
            st.just(b""),
            st.just(b""),
            st.binary(min_size=1, max_size=20),
            st.sampled_from([b"\r\n", b"\n", b"\r\n\r\n"]),
            final_response(),
        )
    )
    if draw(st.integers(0, 2)) == 0:  # cut somewhere: a reset, an EOF or silence at every point
        wire = wire[: draw(st.integers(0, len(wire)))]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(wire) - 1)), max_size=8)))) if len(wire) > 1 else []
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)]) if wire[a:b]]
    ending = draw(st.sampled_from(["open", "eof", "reset"]))
    consumer = draw(st.sampled_from(["read", "stream"]))
    return chunks, ending, consumer


@dataclass
class Outcome:
    error: bool
    status: int | None = None
    body: bytes | None = None
    reusable: bool = False

    def same_as(self, other: Outcome) -> bool:
        if self.error or other.error:
            return self.error == other.error
        return (self.status, self.body, self.reusable) == (other.status, other.body, other.reusable)


# --- the reference ---------------------------------------------------------------------------


def h11_outcome(chunks: list[bytes], ending: str) -> Outcome:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "worker.test"), ("Content-Length", "2")]))
    conn.send(h11.Data(data=b"{}"))
    conn.send(h11.EndOfMessage())
    status, body, done = None, [], False

    def drain() -> None:
        nonlocal status, done
        while not done:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                done = True

    try:
        for chunk in chunks:
            conn.receive_data(chunk)
            drain()
        if ending == "eof":
            conn.receive_data(b"")
            drain()
    except h11.RemoteProtocolError:
        return Outcome(error=True)
    if not done:
        return Outcome(error=True)
    reusable = (
        ending == "open"
        and conn.our_state is h11.DONE
        and conn.their_state is h11.DONE
        and conn.trailing_data == (b"", False)
    )
    return Outcome(False, status, b"".join(body), reusable)


# --- the client, on a fake transport ---------------------------------------------------------


class FakeTransport:
    """Delivers chunks to the protocol as an asyncio transport would: nothing while
    paused or after abort; the ending (EOF or reset) after the last chunk."""

    def __init__(self, protocol: _Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.protocol = protocol
        self.loop = loop
        self.pending: deque[bytes] = deque()
        self.paused = False
        self.closed = False
        self.ending: Exception | None | str = "none"
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        self.loop.call_soon(self.deliver)

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.pending.clear()
            self.loop.call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def push(self, data: bytes) -> None:
        self.pending.append(data)
        self.deliver()

    def end(self, exc: Exception | None) -> None:
        self.ending = exc
        self.deliver()

    def deliver(self) -> None:
        while self.pending and not self.paused and not self.closed:
            self.protocol.data_received(self.pending.popleft())
        if not self.pending and not self.paused and not self.closed and self.ending != "none":
            self.closed = True
            self.protocol.connection_lost(self.ending)

    def settled(self) -> bool:
        return self.closed or self.paused is False and not self.pending


async def client_outcome(chunks: list[bytes], ending: str, consumer: str) -> Outcome:
    loop = asyncio.get_running_loop()
    client = UpstreamClient(idle_timeout_s=3600, max_header_bytes=1 << 20, max_body_bytes=1 << 20)
    pool = client._pool(ORIGIN)
    connection = _Connection(loop, pool)
    transport = FakeTransport(connection, loop)
    connection.connection_made(transport)

    async def connect(loop):
        return connection

    pool.connect = connect

    async def call():
        response = await client.request(ORIGIN, "POST", "/", b"{}")
        if consumer == "read":
            body = await response.read()
        else:
            body = b"".join([chunk async for chunk in response.iter_chunks()])
        return response.status, body

    task = asyncio.ensure_future(call())
    await asyncio.sleep(0)
    assert transport.written, "the request was not sent"
    for chunk in chunks:
        transport.push(chunk)
        await asyncio.sleep(0)  # the consumer takes what it can
    for _ in range(10_000):  # until the consumer has taken everything it will take
        if transport.settled():
            break
        await asyncio.sleep(0)
    else:
        raise AssertionError("the transport never settled")
    if ending == "open":
        await asyncio.sleep(0)
        if connection.timer is not None:  # a reply is still due: let its idle timer expire
            connection.timer.cancel()
            connection.last_io -= 3600
            connection._on_timer()
    else:
        transport.end(ConnectionResetError() if ending == "reset" else None)
    try:
        status, body = await asyncio.wait_for(task, 5)
    except UpstreamError:
        outcome = Outcome(error=True)
    else:
        await asyncio.sleep(0)  # connection_lost after an abort runs on the next turn
        outcome = Outcome(False, status, body, connection.state == IDLE and connection in pool.idle)
    assert not (connection in pool.idle and connection.paused), "a paused connection went back to the pool"
    client.close()
    return outcome


@pytest.fixture(scope="module")
def loop():
    """uvloop's: the loop the proxy runs on (test_upstream.py runs on both)."""
    loop = uvloop.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def tiny_high_water(monkeypatch):
    """Pause and resume on nearly every chunk, so flow control is part of every case."""
    monkeypatch.setattr(upstream, "_HIGH_WATER", 8)
    monkeypatch.setattr(upstream, "_LOW_WATER", 4)


FAST = settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)


@FAST
@given(case=exchange())
def test_client_agrees_with_h11(loop, tiny_high_water, case):
    chunks, ending, consumer = case
    expected = h11_outcome(chunks, ending)
    event("error" if expected.error else "reusable" if expected.reusable else "whole, not reusable")
    got = loop.run_until_complete(client_outcome(chunks, ending, consumer))
    assert got.same_as(expected), f"client {got} != h11 {expected}"


@pytest.mark.parametrize(
    "chunks",
    [
        [b"HTTP/1.1 100 OK\r\n\r\n\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"],  # found by CI's run of the above
        [
            b"HTTP/1.1 100 OK\r\n\r\n",
            b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        ],  # the line in a segment of its own
        [b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 OK\r\n\r\n\r\nHTTP/1.1 200 OK\r\n\r\n"],
    ],
)
def test_an_empty_line_after_an_interim_reply_is_an_error_as_in_h11(loop, chunks):
    expected = h11_outcome(chunks, "open")
    assert expected.error
    assert loop.run_until_complete(client_outcome(chunks, "open", "read")).same_as(expected)


def test_interim_replies_then_the_final_one_are_read_as_in_h11(loop):
    chunks = [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n",
        b"Link: </a>\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ]
    expected = h11_outcome(chunks, "open")
    assert not expected.error and expected.body == b"ok"
    assert loop.run_until_complete(client_outcome(chunks, "open", "read")).same_as(expected)


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(wire=final_response(), trailing=st.one_of(final_response(), st.binary(min_size=1, max_size=8)), data=st.data())
def test_complete_reply_then_anything_is_never_reused(loop, tiny_high_water, wire, trailing, data):
    """The case that desynchronised connections: a whole reply and more bytes, in one
    segment or split anywhere. The reply is the first message's; the connection is not
    reused."""
    stream = wire + trailing
    cut = data.draw(st.integers(1, len(stream)))
    chunks = [stream[:cut], stream[cut:]] if cut < len(stream) else [stream]
    expected = h11_outcome(chunks, "open")
    got = loop.run_until_complete(client_outcome(chunks, "open", data.draw(st.sampled_from(["read", "stream"]))))
    assert got.same_as(expected), f"client {got} != h11 {expected}"
    if not got.error:
        assert not got.reusable


# --- over real sockets -----------------------------------------------------------------------

NEXT_REPLY = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nthe-next!"


class ScriptedWorker:
    """A worker on a real socket: the first request on each connection gets the scripted
    chunks and ending; any later one gets NEXT_REPLY."""

    def __init__(self, chunks: list[bytes], ending: str) -> None:
        self.chunks = chunks
        self.ending = ending
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.done = asyncio.Event()  # the scripted reply and its ending are out

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        first = self.connections == 1
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in request.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if not first:
                    writer.write(NEXT_REPLY)
                    continue
                first = False
                for chunk in self.chunks:
                    writer.write(chunk)
                    await writer.drain()
                    await asyncio.sleep(0)
                if self.ending == "reset":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                elif self.ending == "eof":
                    writer.close()
                self.done.set()
                if self.ending != "open":
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.done.set()


async def socket_outcome(chunks: list[bytes], ending: str, consumer: str) -> tuple[Outcome, bytes | None]:
    worker = ScriptedWorker(chunks, ending)
    server = await asyncio.start_server(worker.serve, "127.0.0.1", 0)
    origin = "http://127.0.0.1:%d" % server.sockets[0].getsockname()[1]
    client = UpstreamClient(idle_timeout_s=0.2)
    try:
        try:
            response = await client.request(origin, "POST", "/", b"{}")
            if consumer == "read":
                body = await response.read()
            else:
                body = b"".join([chunk async for chunk in response.iter_chunks()])
            outcome = Outcome(False, response.status, body)
        except UpstreamError:
            outcome = Outcome(error=True)
        # Whatever happened, the next request gets its own reply: on the same connection
        # only if it was whole and clean, else on a new one.
        await asyncio.wait_for(worker.done.wait(), 5)
        await asyncio.sleep(0.01)  # for the last bytes or the close to reach the client
        pool = client._pool(origin)
        outcome.reusable = any(c.state == IDLE for c in pool.idle)
        nxt = await client.request(origin, "GET", "/next")
        next_body = await nxt.read()
        return outcome, next_body
    finally:
        client.close()
        for writer in worker.writers:
            writer.transport.abort()
        server.close()


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=exchange())
def test_over_real_sockets_the_next_request_gets_its_own_reply(loop, case):
    chunks, ending, consumer = case
    expected = h11_outcome(chunks, ending)
    got, next_body = loop.run_until_complete(socket_outcome(chunks, ending, consumer))
    assert next_body == b"the-next!"
    if expected.error:
        assert got.error
    else:
        # Over TCP the segments may merge, which changes nothing that h11 decides.
        assert not got.error and (got.status, got.body) == (expected.status, expected.body)
        assert got.reusable == expected.reusable
