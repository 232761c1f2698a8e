"""An instantly answering stand-in vLLM worker for proxy benchmarks (not for tests of
features). Raw asyncio HTTP/1.1 with keep-alive, so it is never the bottleneck.

    python -m loadtest.micro.instant_worker --port 9100
"""

from __future__ import annotations

import argparse
import asyncio
import json

PREFILL_REPLY = json.dumps(
    {
        "id": "cmpl-x",
        "object": "text_completion",
        "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "remote_engine_id": "bench",
            "remote_block_ids": [[1]],
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
        },
    }
).encode()
DECODE_REPLY = json.dumps(
    {
        "id": "cmpl-x",
        "object": "text_completion",
        "model": "bench",
        "choices": [{"index": 0, "text": " hello world", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
    }
).encode()


def response(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


class Handler(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].lower()
            length = 0
            marker = head.find(b"content-length:")
            if marker >= 0:
                length = int(head[marker + 15 : head.find(b"\r\n", marker) if head.find(b"\r\n", marker) > 0 else None])
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            body = self.buffer[head_end + 4 : end]
            self.buffer = self.buffer[end:]
            if head.startswith(b"get"):
                self.transport.write(response(b"{}"))
            elif b'"do_remote_decode":true' in body.replace(b" ", b""):
                self.transport.write(response(PREFILL_REPLY))
            else:
                self.transport.write(response(DECODE_REPLY))


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Handler, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=9100)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
