"""The proxy's HTTP client against a raw asyncio HTTP server that misbehaves on request,
on both event loops (tests/unit/proxy/conftest.py): asyncio's and uvloop, which the proxy
runs on (uvicorn's `auto`), and whose transports differ (a write after a reset raises there)."""

import asyncio
import socket
import struct

import pytest

from proxy.upstream.client import UpstreamClient, UpstreamError
from tests.polling import until


class Server:
    """Answers each request with `handler(head, body) -> bytes | None` (None: say nothing);
    records connections and whether each saw its client leave."""

    def __init__(self, handler):
        self.handler = handler
        self.connections = 0
        self.eofs = 0
        self.requests: list[bytes] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                answer = await self.handler(head, body, writer)
                if answer is None:
                    continue
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eofs += 1
        finally:
            writer.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.origin = "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


async def echo(head, body, writer):
    return ok(b'{"got":%d}' % len(body))


async def test_keep_alive_reuses_one_connection():
    async with Server(echo) as server:
        client = UpstreamClient()
        for _ in range(3):
            resp = await client.request(server.origin, "POST", "/v1/completions", b'{"a":1}', {"X-Request-Id": "r1"})
            assert resp.status == 200 and await resp.read() == b'{"got":7}'
        assert server.connections == 1
        assert b"X-Request-Id: r1\r\n" in server.requests[0]
        assert b"Content-Length: 7\r\n" in server.requests[0]
        client.close()


async def test_chunked_stream_arrives_in_pieces_and_completes():
    gate = asyncio.Event()

    async def stream(head, body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"6\r\ndata: \r\n")
        await writer.drain()
        await gate.wait()
        return b"3\r\nabc\r\n0\r\n\r\n"

    async with Server(stream) as server:
        client = UpstreamClient()
        resp = await client.request(server.origin, "POST", "/", b"{}")
        assert resp.headers["content-type"] == "text/event-stream"
        chunks = []
        async for chunk in resp.iter_chunks():
            chunks.append(chunk)
            gate.set()
        assert b"".join(chunks) == b"data: abc" and len(chunks) == 2
        assert resp.complete
        client.close()


async def test_timeout_raises_and_drops_the_connection():
    async def silent(head, body, writer):
        return None

    async with Server(silent) as server:
        client = UpstreamClient()
        with pytest.raises(UpstreamError) as error:
            await client.request(server.origin, "POST", "/", b"{}", timeout_s=0.2)
        assert error.value.reason == "timeout"
        await until(lambda: server.eofs == 1)  # the server sees its client leave
        client.close()


async def test_refused_connection_is_a_connect_error():
    async with Server(echo) as server:
        origin = server.origin
    with pytest.raises(UpstreamError) as error:
        await UpstreamClient().request(origin, "GET", "/health")
    assert error.value.reason == "connect_error"


async def test_idle_connection_closed_by_the_worker_is_replaced_transparently():
    async def close_after_answer(head, body, writer):
        writer.write(ok(b"{}"))
        await writer.drain()
        writer.close()  # like a worker whose keep-alive timer fired
        return None

    async with Server(close_after_answer) as server:
        client = UpstreamClient()
        for _ in range(3):
            resp = await client.request(server.origin, "POST", "/", b"{}")
            assert await resp.read() == b"{}"
            await asyncio.sleep(0.05)
        assert server.connections == 3
        client.close()


async def test_connection_close_header_is_honoured():
    async def close_header(head, body, writer):
        return ok(b"{}", b"connection: close\r\n")

    async with Server(close_header) as server:
        client = UpstreamClient()
        for _ in range(2):
            await (await client.request(server.origin, "POST", "/", b"{}")).read()
        assert server.connections == 2
        client.close()


async def test_cancelled_caller_closes_the_connection():
    async def slow(head, body, writer):
        await asyncio.sleep(0.3)  # then the server reads on, and sees whether its client left

    async with Server(slow) as server:
        client = UpstreamClient()
        task = asyncio.ensure_future(client.request(server.origin, "POST", "/", b"{}"))
        while not server.requests:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: server.eofs == 1)  # vLLM aborts a request whose client left
        client.close()


async def test_worker_dying_mid_body_is_a_connection_reset():
    async def half(head, body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()
        return None

    async with Server(half) as server:
        client = UpstreamClient()
        resp = await client.request(server.origin, "POST", "/", b"{}")
        with pytest.raises(UpstreamError) as error:
            await resp.read()
        assert error.value.reason == "connection_reset"
        client.close()


async def test_body_delimited_by_close():
    async def no_length(head, body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()
        return None

    async with Server(no_length) as server:
        resp = await UpstreamClient().request(server.origin, "GET", "/x")
        assert await resp.read() == b"until the end"


async def test_garbage_is_a_protocol_error():
    async def garbage(head, body, writer):
        return b"NOT HTTP AT ALL\r\n\r\n"

    async with Server(garbage) as server:
        with pytest.raises(UpstreamError) as error:
            await UpstreamClient().request(server.origin, "GET", "/x")
        assert error.value.reason == "protocol_error"


# --- regressions (issue 9): each failed on the client before its rewrite -----------------


async def next_request_gets_its_own_reply(client, origin) -> None:
    """After anything, the next request on this origin gets the answer to itself."""
    resp = await client.request(origin, "POST", "/", b'{"next":1}')
    assert resp.status == 200 and await asyncio.wait_for(resp.read(), 5) == b'{"got":10}'


async def test_large_reply_read_whole_does_not_hang_and_its_connection_serves_the_next():
    """It hung: reading paused at 256 KiB and read() never resumed it."""
    big = b"x" * (3 * 1024 * 1024)

    async def large_in_pieces(head, body, writer):
        if body == b"{}":
            whole = ok(big)
            for start in range(0, len(whole), 64 * 1024):
                writer.write(whole[start : start + 64 * 1024])
                await writer.drain()
            return None
        return ok(b'{"got":%d}' % len(body))

    async with Server(large_in_pieces) as server:
        client = UpstreamClient()
        resp = await client.request(server.origin, "POST", "/", b"{}")
        assert await asyncio.wait_for(resp.read(), 10) == big
        await next_request_gets_its_own_reply(client, server.origin)
        assert server.connections == 1  # the connection was whole, unpaused, and reused
        client.close()


async def test_slow_streaming_consumer_pauses_then_gets_everything_and_the_connection_is_reused():
    events = [b"data: %06d %s\n\n" % (i, b"y" * 1000) for i in range(1500)]  # about 1.5 MB

    async def stream(head, body, writer):
        if body != b"{}":
            return ok(b'{"got":%d}' % len(body))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return None

    async with Server(stream) as server:
        client = UpstreamClient()
        resp = await client.request(server.origin, "POST", "/", b"{}")
        received, paused_seen = [], False
        async for chunk in resp.iter_chunks():
            received.append(chunk)
            paused_seen |= resp._connection.paused
            if len(received) % 50 == 0:
                await asyncio.sleep(0.005)  # a slow client
        assert b"".join(received) == b"".join(events)
        assert paused_seen  # flow control did engage...
        await next_request_gets_its_own_reply(client, server.origin)
        assert server.connections == 1  # ...and the connection went back unpaused
        client.close()


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n",
    ],
)
async def test_interim_replies_are_not_the_reply(interim):
    """A 103 was taken for the final reply, and the real one went to the next request."""
    count = 0

    async def hints(head, body, writer):
        nonlocal count
        count += 1
        return interim + ok(b'{"reply":%d}' % count)

    async with Server(hints) as server:
        client = UpstreamClient()
        for expected in (1, 2, 3):
            resp = await client.request(server.origin, "POST", "/", b"{}")
            assert resp.status == 200 and "link" not in resp.headers
            assert await asyncio.wait_for(resp.read(), 5) == b'{"reply":%d}' % expected
        assert server.connections == 1
        client.close()


async def test_interim_then_final_split_across_segments():
    async def hints(head, body, writer):
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: <x>\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        return ok(b'{"got":%d}' % len(body))

    async with Server(hints) as server:
        client = UpstreamClient()
        resp = await client.request(server.origin, "POST", "/", b"{}")
        assert resp.status == 200 and await resp.read() == b'{"got":2}'
        client.close()


async def test_two_replies_in_one_segment_are_not_merged_and_the_second_reaches_nobody():
    async def two(head, body, writer):
        if body == b"{}":
            return ok(b'{"first":1}') + ok(b'{"stray":2}')
        return ok(b'{"got":%d}' % len(body))

    async with Server(two) as server:
        client = UpstreamClient()
        resp = await client.request(server.origin, "POST", "/", b"{}")
        assert await resp.read() == b'{"first":1}'
        await next_request_gets_its_own_reply(client, server.origin)
        assert server.connections == 2  # the first connection was not reused
        client.close()


@pytest.mark.parametrize("trailing", [b"garbage", b"\r\n", b"HTTP/1.1 200 OK\r\n"])
async def test_bytes_after_a_reply_make_its_connection_unusable(trailing):
    async def extra(head, body, writer):
        if body == b"{}":
            return ok(b'{"first":1}') + trailing
        return ok(b'{"got":%d}' % len(body))

    async with Server(extra) as server:
        client = UpstreamClient()
        resp = await client.request(server.origin, "POST", "/", b"{}")
        assert await resp.read() == b'{"first":1}'
        await next_request_gets_its_own_reply(client, server.origin)
        assert server.connections == 2
        client.close()


@pytest.mark.parametrize("coding", [b"chunked", b"Chunked", b"CHUNKED"])
async def test_chunked_body_cut_short_is_an_error_in_any_letter_case(coding):
    async def cut(head, body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: %s\r\n\r\n5\r\nhello\r\n" % coding)
        await writer.drain()
        writer.close()
        return None

    async with Server(cut) as server:
        resp = await UpstreamClient().request(server.origin, "POST", "/", b"{}")
        with pytest.raises(UpstreamError) as error:
            await resp.read()
        assert error.value.reason == "connection_reset"


async def test_body_without_length_cut_by_a_reset_is_an_error():
    async def reset(head, body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\npartial")
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN
        return None

    async with Server(reset) as server:
        resp = await UpstreamClient().request(server.origin, "POST", "/", b"{}")
        with pytest.raises(UpstreamError) as error:
            await resp.read()
        assert error.value.reason == "connection_reset"


async def test_oversized_head_is_refused_without_reading_it_all():
    async def huge(head, body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nx-filler: ")
        for _ in range(20 * 16):  # 20 MB of one header, as in the issue
            writer.write(b"a" * 65536)
            await writer.drain()
        return b"\r\ncontent-length: 0\r\n\r\n"

    async with Server(huge) as server:
        client = UpstreamClient(max_header_bytes=64 * 1024)
        with pytest.raises(UpstreamError) as error:
            await asyncio.wait_for(client.request(server.origin, "GET", "/"), 10)
        assert error.value.reason == "headers_too_large"


async def test_many_header_lines_over_the_limit_are_refused():
    async def many(head, body, writer):
        return (
            b"HTTP/1.1 200 OK\r\n"
            + b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(200))
            + (b"content-length: 0\r\n\r\n")
        )

    async with Server(many) as server:
        with pytest.raises(UpstreamError) as error:
            await UpstreamClient(max_header_bytes=8 * 1024).request(server.origin, "GET", "/")
        assert error.value.reason == "headers_too_large"
        resp = await UpstreamClient(max_header_bytes=64 * 1024).request(server.origin, "GET", "/")
        assert len(resp.headers) == 201  # under the limit it is fine


async def test_body_over_the_limit_is_refused_when_read_whole_but_streams_freely():
    async def big(head, body, writer):
        return ok(b"z" * 200_000)

    async with Server(big) as server:
        resp = await UpstreamClient(max_body_bytes=100_000).request(server.origin, "GET", "/")
        with pytest.raises(UpstreamError) as error:
            await resp.read()
        assert error.value.reason == "body_too_large"
        resp = await UpstreamClient(max_body_bytes=100_000).request(server.origin, "GET", "/")
        assert len(b"".join([c async for c in resp.iter_chunks()])) == 200_000


async def test_a_stream_longer_than_the_idle_timeout_lives_while_it_keeps_talking():
    """One total deadline per leg cut healthy long streams; silence is what counts."""

    async def trickle(head, body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(8):
            await asyncio.sleep(0.1)
            writer.write(b"1\r\n.\r\n")
            await writer.drain()
        return b"0\r\n\r\n"

    async with Server(trickle) as server:
        client = UpstreamClient(idle_timeout_s=0.5)
        resp = await client.request(server.origin, "POST", "/", b"{}")  # no total: runs 0.8 s
        assert b"".join([c async for c in resp.iter_chunks()]) == b"." * 8
        resp = await client.request(server.origin, "POST", "/", b"{}", timeout_s=0.4)  # with a total
        with pytest.raises(UpstreamError) as error:
            async for _ in resp.iter_chunks():
                pass
        assert error.value.reason == "timeout"
        client.close()


async def test_silence_longer_than_the_idle_timeout_is_a_timeout():
    async def stall(head, body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\n.\r\n")
        await writer.drain()
        await asyncio.sleep(5)
        return None

    async with Server(stall) as server:
        client = UpstreamClient(idle_timeout_s=0.3)
        resp = await client.request(server.origin, "POST", "/", b"{}")
        started = asyncio.get_running_loop().time()
        with pytest.raises(UpstreamError) as error:
            async for _ in resp.iter_chunks():
                pass
        assert error.value.reason == "timeout"
        assert asyncio.get_running_loop().time() - started < 3
        await until(lambda: server.eofs == 1)  # and the worker sees its client leave
        client.close()


async def test_upgrade_and_unknown_transfer_codings_are_protocol_errors():
    async def odd(head, body, writer):
        if b"upgrade" in head:
            return b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n"
        return b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nabc"

    async with Server(odd) as server:
        for path in ("/upgrade", "/gzip"):
            with pytest.raises(UpstreamError) as error:
                resp = await UpstreamClient().request(server.origin, "GET", path)
                await resp.read()
            assert error.value.reason == "protocol_error"


async def test_a_new_connection_reset_before_the_request_is_written_is_a_connection_reset(monkeypatch):
    """A worker being killed completes handshakes from its dying listen queue, then resets
    them: the reset may be handled before the request is written. Under uvloop (what the
    proxy runs on) writing to that transport raises RuntimeError; it must be an
    UpstreamError like any other reset, which the caller retries elsewhere."""
    from proxy.upstream import client as upstream

    async def reset_at_once(reader, writer):
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    connect = upstream._OriginPool.connect

    async def connect_then_lose_it(self, loop):
        connection = await connect(self, loop)
        await until(lambda: connection.state == upstream.BROKEN)  # the reset handled first
        return connection

    monkeypatch.setattr(upstream._OriginPool, "connect", connect_then_lose_it)
    server = await asyncio.start_server(reset_at_once, "127.0.0.1", 0)
    origin = "http://127.0.0.1:%d" % server.sockets[0].getsockname()[1]
    client = UpstreamClient(idle_timeout_s=5)  # a regression on asyncio's loop waits for it
    sent = []
    try:
        with pytest.raises(UpstreamError) as error:
            await client.request(origin, "POST", "/", b"{}", on_sent=lambda: sent.append(1))
        assert error.value.reason == "connection_reset"
        assert not sent  # nothing went on the wire: a decode leg's KV was not handed over
    finally:
        client.close()
        server.close()


async def test_a_pooled_connection_found_closing_is_replaced_before_anything_is_written():
    """Taken from the pool after its transport began closing, before its connection_lost
    ran: the request goes out on a new connection, once, as for any idle connection the
    worker closed (it used to fail: the old connection's byte count said it had answered)."""
    async with Server(echo) as server:
        client = UpstreamClient(idle_timeout_s=5)
        assert await (await client.request(server.origin, "POST", "/", b"{}")).read() == b'{"got":2}'
        (pooled,) = client._pool(server.origin).idle
        pooled.transport.close()  # closing now; connection_lost comes at the loop's next turn
        resp = await client.request(server.origin, "POST", "/", b"{}")
        assert await resp.read() == b'{"got":2}'
        assert server.connections == 2 and len(server.requests) == 2
        client.close()
