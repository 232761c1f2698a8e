"""The proxy's HTTP client against a raw asyncio HTTP server that misbehaves on request."""

import asyncio

import pytest

from proxy.upstream import UpstreamClient, UpstreamError


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


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body), extra, body,
    )  # fmt: skip


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
