"""The real proxy against a raw HTTP/1.1 stand-in worker that sends legal but unusual
replies: interim 1xx replies before every answer, and non-streamed answers of megabytes.
Each of these broke the proxy before its worker client was rewritten (issue 9)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import httpx
import pytest

from pdspec.settings import ProxySettings
from proxy.app import create_app
from tests.harness import merged
from tests.standin import ThreadServer


class RawWorker:
    """A worker on a raw asyncio server in its own thread. Prefill legs are answered with
    `kv_transfer_params` naming the leg's X-Request-Id; decode legs echo the params they
    got, padded to `decode_bytes`; every reply is preceded by `interim`, sent first."""

    def __init__(self, interim: bytes = b"", decode_bytes: int = 0) -> None:
        self.interim = interim
        self.decode_bytes = decode_bytes
        self.sock = socket.socket()  # bound now: no other test process takes the port meanwhile
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, sock=self.sock))
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self) -> RawWorker:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def answer(self, head: bytes, body: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if lines[0].startswith("GET"):
            payload = {"object": "list", "data": []}
        else:
            request = json.loads(body)
            kv = request.get("kv_transfer_params") or {}
            if kv.get("do_remote_decode"):
                payload = {
                    "choices": [{"text": "x"}],
                    "kv_transfer_params": {
                        "remote_engine_id": headers["x-request-id"],
                        "remote_block_ids": [[1]],
                        "remote_host": "127.0.0.1",
                        "remote_port": 5600,
                    },
                }
            else:
                text = "decoded with " + kv.get("remote_engine_id", "?")
                payload = {"choices": [{"index": 0, "text": text, "logprobs": "p" * self.decode_bytes}]}
        data = json.dumps(payload).encode()
        final = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data)
        return final + data

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                if self.interim:  # sent early, as hints are, before the work is done
                    writer.write(self.interim)
                    await writer.drain()
                    await asyncio.sleep(0.02)
                reply = self.answer(head, body)
                for start in range(0, len(reply), 65536):  # in segments, as a real worker writes
                    writer.write(reply[start : start + 65536])
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def proxy_for(worker: RawWorker, **settings) -> ThreadServer:
    return ThreadServer(
        create_app(
            ProxySettings(
                prefill_urls=[worker.url],
                decode_urls=[worker.url],
                **merged({"retries": {"prefill_failure_policy": "error"}}, settings),
            )
        )
    )


BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}


@pytest.mark.parametrize(
    "interim", [b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n", b"HTTP/1.1 100 Continue\r\n\r\n"]
)
def test_interim_replies_never_hand_one_request_another_ones_kv_params(interim):
    """A 103 was taken for the prefill reply; the real reply then went to the next leg."""
    with RawWorker(interim=interim) as worker, proxy_for(worker) as proxy:
        for i in range(4):
            rid = f"client-{i}"
            response = httpx.post(proxy.url + "/v1/completions", json=BODY, headers={"X-Request-Id": rid})
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["text"] == f"decoded with {rid}"


def test_a_large_non_streamed_decode_reply_comes_back_and_the_worker_stays_usable():
    """Over 256 KiB the client paused reading and never resumed: no answer until the
    decode timeout, then a paused connection in the pool timed out the next legs."""
    with RawWorker(decode_bytes=900_000) as worker, proxy_for(worker, worker_client={"decode_timeout_s": 20}) as proxy:
        for _ in range(3):
            response = httpx.post(proxy.url + "/v1/completions", json=BODY, timeout=30)
            assert response.status_code == 200, response.text[:200]
            assert len(response.json()["choices"][0]["logprobs"]) == 900_000
        ready = httpx.get(proxy.url + "/ready")
        assert ready.status_code == 200


def test_the_worker_body_limit_is_a_setting_and_an_over_limit_reply_is_a_502():
    with (
        RawWorker(decode_bytes=300_000) as worker,
        proxy_for(worker, worker_client={"max_body_bytes": 100_000}) as proxy,
    ):
        response = httpx.post(proxy.url + "/v1/completions", json=BODY, timeout=30)
    assert response.status_code == 502 and "body_too_large" in response.json()["error"]["message"]
