"""An instantly answering stand-in vLLM worker for proxy benchmarks (not for tests of
features). Raw asyncio HTTP/1.1 with keep-alive, so it is never the bottleneck.

    python -m loadtest.micro.instant_worker --port 9100 [--stream-tokens 64] [--block-size 16] [--tokenizer PATH]

Every process answers both legs, so one stands for a prefill worker, a decode worker or
both. What it answers, by method, path and body:
- a prefill leg (a POST whose `kv_transfer_params` has `"do_remote_decode": true`): one
  token, and `kv_transfer_params` naming a NIXL side channel at 127.0.0.1:5600;
- any other POST to a generation path: the decode reply; with `"stream": true`, a
  chunked `text/event-stream` of `--stream-tokens` completion events (one token each,
  the last with `finish_reason`), then `data: [DONE]`, each event its own write, none
  waited for: an instant worker's pace;
- `POST /tokenize`: vLLM's reply, a token id per whitespace-separated word of the
  prompt (a chat: of its messages' text), the word's CRC-32, so the same text has the
  same ids in every worker and a word is one token; with `--tokenizer PATH` (a model
  folder or its `tokenizer.json`), a text prompt's ids are that tokenizer's, as vLLM's
  would be (its `add_special_tokens`, default true), so a proxy that tokenizes with the
  same file agrees with it;
- `POST /v1/completions/render`: vLLM's scale-out render reply, a list of one
  `GenerateRequest` per prompt whose `token_ids` are those same ids;
- `GET /metrics`: `pdspec_worker_info` with `--block-size` (pdspec's cache-aware routing
  keys prompts by it, and routes without reading the ids when no worker reports one);
- `GET /v1/models`: one model card, `bench`;
- `GET /stats`: how many requests of each kind it answered (`KINDS`), as JSON, so a
  benchmark can see which calls a proxy made per request;
- any other GET: `{}`.

/tokenize and render replies are computed once per distinct body (benchmarks repeat a few
prompts), so a long prompt costs the worker a dictionary lookup, not a tokenization.

Failure policy: none; a request it cannot parse is answered as a decode leg.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import re
import socket
import zlib
from collections import Counter
from pathlib import Path

from pdspec.contract import WORKER_INFO_METRIC

MODEL = "bench"
KINDS = ("prefill", "decode", "decode_stream", "tokenize", "render", "metrics", "stats", "other")
VOCABULARY = 100_000  # token ids below this, as a model's vocabulary bounds them

PREFILL_LEG = re.compile(rb'"do_remote_decode"\s*:\s*true')
STREAMED = re.compile(rb'"stream"\s*:\s*true')

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
        "model": MODEL,
        "choices": [{"index": 0, "text": " hello world", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
    }
).encode()
MODELS_REPLY = json.dumps(
    {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 32768}]}
).encode()


def response(body: bytes, content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (content_type, len(body), body)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (an empty `data` is the last chunk)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


@functools.cache
def stream_reply(tokens: int) -> tuple[bytes, ...]:
    """The streamed decode reply as its writes: the head, one chunk per SSE event, the end."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    events = []
    for i in range(tokens):
        event = {
            "id": "cmpl-x",
            "object": "text_completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {"index": 0, "text": f" t{i}", "logprobs": None, "finish_reason": "length" if i == tokens - 1 else None}
            ],
        }
        events.append(chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
    return (head, *events, chunk(b"data: [DONE]\n\n") + chunk(b""))


def token_ids(text: str, add_special_tokens: bool = True) -> list[int]:
    """The ids of `text`: the `--tokenizer`'s when one was given, else a token id per
    whitespace-separated word: its CRC-32, within the vocabulary."""
    if TOKENIZER is not None:
        return TOKENIZER.encode(text, add_special_tokens=add_special_tokens).ids
    return [zlib.crc32(word.encode()) % VOCABULARY for word in text.split()]


TOKENIZER = None  # a `tokenizers.Tokenizer`, set by `use_tokenizer`


def use_tokenizer(path: str | None) -> None:
    """Tokenize text with the `tokenizers` file at `path` (a folder holding tokenizer.json)."""
    global TOKENIZER
    if path is None:
        TOKENIZER = None
        return
    from tokenizers import Tokenizer  # only a worker given --tokenizer needs it

    file = Path(path) / "tokenizer.json" if Path(path).is_dir() else Path(path)
    TOKENIZER = Tokenizer.from_file(str(file))
    tokenize_reply.cache_clear()
    render_reply.cache_clear()


def prompt_text(request: dict) -> str:
    """The text of a /tokenize request: its prompt, or its chat messages' text."""
    if isinstance(request.get("prompt"), str):
        return request["prompt"]
    parts = []
    for message in request.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [part.get("text", "") for part in content if isinstance(part, dict)]
    return " ".join(parts)


@functools.lru_cache(maxsize=1024)
def tokenize_reply(body: bytes) -> bytes:
    try:
        request = json.loads(body)
        ids = token_ids(prompt_text(request), request.get("add_special_tokens", True) is not False)
    except (ValueError, AttributeError):
        ids = []
    return json.dumps({"count": len(ids), "max_model_len": 32768, "tokens": ids}).encode()


@functools.lru_cache(maxsize=1024)
def render_reply(body: bytes) -> bytes:
    """vLLM's /v1/completions/render: one GenerateRequest per prompt (text or ids)."""
    try:
        request = json.loads(body)
        prompt = request.get("prompt")
    except (ValueError, AttributeError):
        request, prompt = {}, ""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    rendered = [
        {
            "request_id": "instant",
            "token_ids": each if isinstance(each, list) else token_ids(str(each)),
            "sampling_params": {"max_tokens": request.get("max_tokens") or 16},
            "model": request.get("model"),
            "stream": bool(request.get("stream")),
            "kv_transfer_params": None,
        }
        for each in prompt or [""]
    ]
    return json.dumps(rendered).encode()


def metrics_reply(block_size: int) -> bytes:
    return (
        f"# HELP {WORKER_INFO_METRIC} 1 per worker; labels: its role and the config its engine runs with.\n"
        f"# TYPE {WORKER_INFO_METRIC} gauge\n"
        f'{WORKER_INFO_METRIC}{{role="instant",model="{MODEL}",block_size="{block_size}"}} 1.0\n'
    ).encode()


class InstantWorker:
    """What one worker process answers, and how many of each kind it has answered."""

    def __init__(self, stream_tokens: int = 64, block_size: int = 16) -> None:
        self.stream_tokens = stream_tokens
        self.block_size = block_size
        self.counts: Counter[str] = Counter()

    def kind(self, method: bytes, path: bytes, body: bytes) -> str:
        """Which reply a request gets (one of KINDS)."""
        if method == b"GET":
            return {b"/metrics": "metrics", b"/stats": "stats"}.get(path, "other")
        if path == b"/tokenize":
            return "tokenize"
        if path == b"/v1/completions/render":
            return "render"
        if PREFILL_LEG.search(body):
            return "prefill"
        return "decode_stream" if STREAMED.search(body) else "decode"

    def reply(self, method: bytes, path: bytes, body: bytes) -> tuple[bytes, ...]:
        """The writes that answer one request, in order."""
        kind = self.kind(method, path, body)
        self.counts[kind] += 1
        if kind == "prefill":
            return (response(PREFILL_REPLY),)
        if kind == "decode":
            return (response(DECODE_REPLY),)
        if kind == "decode_stream":
            return stream_reply(self.stream_tokens)
        if kind == "tokenize":
            return (response(tokenize_reply(body)),)
        if kind == "render":
            return (response(render_reply(body)),)
        if kind == "metrics":
            return (response(metrics_reply(self.block_size), b"text/plain; version=0.0.4"),)
        if kind == "stats":
            return (response(json.dumps({name: self.counts[name] for name in KINDS}).encode()),)
        return (response(MODELS_REPLY if path == b"/v1/models" else b"{}"),)


class Handler(asyncio.Protocol):
    def __init__(self, worker: InstantWorker) -> None:
        self.worker = worker

    def connection_made(self, transport):
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end]
            request_line, _, headers = head.partition(b"\r\n")
            method, _, rest = request_line.partition(b" ")
            path = rest.partition(b" ")[0].partition(b"?")[0]
            length = content_length(headers)
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            body = self.buffer[head_end + 4 : end]
            self.buffer = self.buffer[end:]
            for piece in self.worker.reply(method, path, body):
                self.transport.write(piece)


def content_length(headers: bytes) -> int:
    lowered = headers.lower()
    marker = lowered.find(b"content-length:")
    if marker < 0:
        return 0
    line_end = lowered.find(b"\r\n", marker)
    return int(lowered[marker + 15 : line_end if line_end >= 0 else None])


async def start_server(
    worker: InstantWorker, port: int | None = None, sock: socket.socket | None = None
) -> asyncio.Server:
    """Serve `worker` on 127.0.0.1:`port`, or on a socket already bound (the caller picked
    a free port by binding it, so no other process can take it first)."""
    loop = asyncio.get_running_loop()
    if sock is not None:
        return await loop.create_server(lambda: Handler(worker), sock=sock)
    return await loop.create_server(lambda: Handler(worker), "127.0.0.1", port)


async def serve(port: int, worker: InstantWorker) -> None:
    server = await start_server(worker, port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--stream-tokens", type=int, default=64, help="token events in a streamed decode reply")
    parser.add_argument("--block-size", type=int, default=16, help="the KV block size /metrics reports")
    parser.add_argument("--tokenizer", help="a model folder or tokenizer.json: /tokenize answers with its ids")
    args = parser.parse_args()
    use_tokenizer(args.tokenizer)
    asyncio.run(serve(args.port, InstantWorker(args.stream_tokens, args.block_size)))


if __name__ == "__main__":
    main()
