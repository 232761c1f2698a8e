"""The floor under the proxy's hot path: pdspec's worker client behind a bare HTTP/1.1 server
protocol (httptools, as uvicorn parses), two legs per request and nothing else: no ASGI, no
validation, no metrics, no admission, no routing but one prefill and one decode worker.

What a request must cost in Python on this event loop, to set beside `pdspec proxy` and
vLLM's router in the same sitting (`loadtest/micro/proxy_race.py` races the two;
docs/benchmarks.md, "The proxy race", has all three). It serves whole (non-streamed)
completions only, and is not a proxy to deploy: a malformed body, a worker's error or a
client that leaves mid-request just closes the connection.

    python -m loadtest.micro.bare_proxy --port 31186 --prefill http://127.0.0.1:31190 --decode http://127.0.0.1:31190
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import httptools
import orjson

from loadtest.micro.instant_worker import response
from proxy.upstream.client import UpstreamClient, UpstreamError


class BareProxy:
    """One prefill and one decode worker, and the client that calls them."""

    def __init__(self, prefill_url: str, decode_url: str) -> None:
        self.prefill_url = prefill_url
        self.decode_url = decode_url
        self.client = UpstreamClient()

    async def serve(self, raw: bytes) -> bytes:
        """The decode worker's reply to `raw` (a completion body), after its prefill leg."""
        body = orjson.loads(raw)
        prefill = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        reply = await self.client.request(self.prefill_url, "POST", "/v1/completions", orjson.dumps(prefill))
        params = orjson.loads(await reply.read())["kv_transfer_params"]
        decode = orjson.dumps({**body, "kv_transfer_params": params})
        reply = await self.client.request(self.decode_url, "POST", "/v1/completions", decode)
        return await reply.read()


class Connection(asyncio.Protocol):
    """One client connection: requests in order, each answered with the decode's reply."""

    def __init__(self, proxy: BareProxy) -> None:
        self.proxy = proxy
        self.transport = None
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_begin(self) -> None:
        self.body = []

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        asyncio.ensure_future(self._answer(b"".join(self.body)))

    async def _answer(self, raw: bytes) -> None:
        try:
            out = await self.proxy.serve(raw)
        except (UpstreamError, ValueError, KeyError, TypeError):
            self.transport.close()
            return
        if not self.transport.is_closing():
            self.transport.write(response(out))


async def start_server(proxy: BareProxy, sock: socket.socket) -> asyncio.Server:
    """Serve `proxy` on `sock` (bound, by the caller)."""
    return await asyncio.get_running_loop().create_server(lambda: Connection(proxy), sock=sock)


async def serve(port: int, prefill_url: str, decode_url: str) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = await start_server(BareProxy(prefill_url, decode_url), sock)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=31186)
    parser.add_argument("--prefill", required=True, help="the prefill worker's URL")
    parser.add_argument("--decode", required=True, help="the decode worker's URL")
    args = parser.parse_args()
    import uvloop

    uvloop.run(serve(args.port, args.prefill, args.decode))


if __name__ == "__main__":
    main()
