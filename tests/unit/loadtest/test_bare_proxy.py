"""loadtest/micro/bare_proxy.py: the floor's two legs, on real sockets in front of the instant
worker (which counts what it answered)."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx

from loadtest.micro.bare_proxy import BareProxy, start_server
from tests.standin import InstantWorkerThread


class BareProxyThread:
    def __init__(self, prefill_url: str, decode_url: str) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.proxy = BareProxy(prefill_url, decode_url)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(start_server(self.proxy, self.sock), self.loop).result(10)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.sock.close()


def test_each_request_is_one_prefill_then_one_decode_whose_reply_it_returns():
    with InstantWorkerThread() as prefill, InstantWorkerThread() as decode:
        with BareProxyThread(prefill.url, decode.url) as bare, httpx.Client() as client:
            replies = [
                client.post(bare.url + "/v1/completions", json={"model": "bench", "prompt": "a b", "max_tokens": 4})
                for _ in range(3)
            ]
    assert [r.status_code for r in replies] == [200, 200, 200]
    assert all(r.json()["choices"][0]["text"] == " hello world" for r in replies)
    assert (prefill.worker.counts["prefill"], prefill.worker.counts["decode"]) == (3, 0)
    assert (decode.worker.counts["decode"], decode.worker.counts["prefill"]) == (3, 0)


def test_a_body_that_is_not_json_closes_the_connection():
    with InstantWorkerThread() as worker, BareProxyThread(worker.url, worker.url) as bare:
        try:
            reply = httpx.post(bare.url + "/v1/completions", content=b"{not json")
        except httpx.RemoteProtocolError:
            reply = None
    assert reply is None and worker.worker.counts["prefill"] == 0
