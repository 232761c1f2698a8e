"""A stand-in vLLM worker for unit tests of proxy logic (never the only test of a feature).

It answers the prefill leg with `kv_transfer_params`, the decode leg with text that
shows what it received, and can be told to fail in chosen ways. `/v1/responses` answers
as vLLM 0.32's Responses API does: a response object with `kv_transfer_params` at its top
level and usage in `input_tokens_details`; a stream of `event:`/`data:` events, numbered,
opening with `response.created` and `response.in_progress` and closing with
`response.completed`. `/v1/messages` answers as vLLM's Anthropic Messages API does.
`/v1/responses/render` and `/v1/messages/render` answer as vLLM's scale-out render
endpoints do (vllm/entrypoints/scale_out/render/): a `GenerateRequest` whose `token_ids`
are the prompt (here the bytes of its parts as JSON), or vLLM's 403 when the worker runs
without `--enable-scale-out`.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from loadtest.micro.instant_worker import InstantWorker, start_server


@dataclass
class StandinBehaviour:
    prefill_status: int = 200
    decode_status: int = 200
    omit_kv_params: bool = False
    break_stream_after: int | None = None  # events sent before the stream breaks
    remote_host: str | None = "127.0.0.1"
    remote_port: object = 5600  # vLLM's default NIXL side-channel port
    delay_s: float = 0.0  # before answering any leg
    prefill_tokens_per_s: float | None = None  # prefill legs queue and run one at a time at this rate, as in a worker
    prefills_queued: int = 0  # with prefill_tokens_per_s: legs in its queue now (the one running included)
    most_prefills_queued: int = 0
    fail_decodes: int = 0  # the next this many decode legs get `fail_status`
    fail_prefills: int = 0  # the next this many prefill legs get `fail_status`
    truncate_decodes: int = 0  # the next this many whole (not streamed) decode replies break off mid-body
    transfer_mode: str | None = None  # "push": its kv_transfer_params say so, as NixlPushConnector's do
    engine_id: str = "standin"  # its remote_engine_id
    fail_status: int = 503
    healthy: bool = True
    stream_event_delay_s: float = 0.0  # between the events of a decode stream
    streams_abandoned: int = 0  # decode streams whose client left before the last event
    worker_info: dict | None = None  # labels of its pdspec_worker_info; None: plain vLLM (none)
    features_off: dict[str, str] = field(default_factory=dict)  # its pdspec_engine_feature series that are off
    metrics_status: int = 200
    kv_size_tokens: int | None = None  # with kv_used: vLLM's KV series on /metrics (size in tokens, blocks of 16)
    kv_used: float = 0.0  # vllm:kv_cache_usage_perc
    metrics_reads: int = 0
    cancelled: int = 0  # legs whose client went away while they waited
    received: list[dict] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)  # time.monotonic() of each of `received`
    prefills: int = 0  # prefill legs answered: the n-th names block [[n]], so each prefill's KV is its own
    headers: list[dict] = field(default_factory=list)
    tokenize_status: int = 200
    tokenized: list[dict] = field(default_factory=list)  # /tokenize requests
    tokenize_delay_s: float = 0.0
    # Its /tokenize's ids of a request body (a model's own tokenizer); None: the body's bytes.
    tokenize: Callable[[dict], list[int]] | None = None
    cached_tokens: int = 0  # the prefix-cache hits it reports in a Responses reply's usage
    scale_out: bool = True  # serves the render endpoints (False: vLLM's 403 without --enable-scale-out)
    render_status: int = 200
    render_delay_s: float = 0.0
    render_reply: bytes | None = None  # a reply of its own instead of the GenerateRequest (malformed ones)
    rendered: list[tuple[str, dict]] = field(default_factory=list)  # (path, body) of render requests


def prefill_legs(behaviour: StandinBehaviour) -> list[dict]:
    """The bodies of the prefill legs a stand-in got (those asking for a remote decode), in order."""
    return [b for b in behaviour.received if (b.get("kv_transfer_params") or {}).get("do_remote_decode")]


def parse_events(raw: str) -> list[tuple[str, dict]]:
    """(event line's type, data) of each event of a named-event stream (the Responses and
    Messages APIs); asserts every event has both lines."""
    events = []
    for block in raw.split("\n\n"):
        if not block:
            continue
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        events.append((lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])))
    return events


def decode_legs(behaviour: StandinBehaviour) -> list[dict]:
    """The bodies of the decode legs a stand-in got (all but prefill legs), in order."""
    return [b for b in behaviour.received if not (b.get("kv_transfer_params") or {}).get("do_remote_decode")]


def prompt_tokens(body: dict) -> int:
    """A prompt's size as the stand-in counts it: its token ids, or a token per 3 characters."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    return len(json.dumps(prompt if prompt is not None else body.get("messages"))) // 3 + 1


def create_standin(behaviour: StandinBehaviour) -> FastAPI:
    app = FastAPI()
    prefill_queue = asyncio.Lock()  # binds to the server's event loop on first use

    async def handle(request: Request, chat: bool, responses: bool = False, messages: bool = False):
        body = await request.json()
        behaviour.received.append(body)
        behaviour.received_at.append(time.monotonic())
        behaviour.headers.append(dict(request.headers))
        kv = body.get("kv_transfer_params") or {}
        is_prefill = kv.get("do_remote_decode") is True
        status = behaviour.prefill_status if is_prefill else behaviour.decode_status
        if not is_prefill and behaviour.fail_decodes > 0:
            behaviour.fail_decodes -= 1
            status = behaviour.fail_status
        if is_prefill and behaviour.fail_prefills > 0:
            behaviour.fail_prefills -= 1
            status = behaviour.fail_status
        if behaviour.delay_s:
            # Like vLLM, notice a caller that went away while the work was pending.
            deadline = time.monotonic() + behaviour.delay_s
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    behaviour.cancelled += 1
                    return JSONResponse({}, status_code=499)
                await asyncio.sleep(0.01)
        if is_prefill and behaviour.prefill_tokens_per_s:
            behaviour.prefills_queued += 1
            behaviour.most_prefills_queued = max(behaviour.most_prefills_queued, behaviour.prefills_queued)
            try:
                async with prefill_queue:  # behind the prefills sent before it, like vLLM's waiting queue
                    if await request.is_disconnected():
                        behaviour.cancelled += 1
                        return JSONResponse({}, status_code=499)
                    await asyncio.sleep(prompt_tokens(body) / behaviour.prefill_tokens_per_s)
            finally:
                behaviour.prefills_queued -= 1
        if status != 200:
            return JSONResponse({"error": {"message": f"stand-in {status}", "type": "X", "code": status}}, status)
        if is_prefill:
            behaviour.prefills += 1
            params = (
                None
                if behaviour.omit_kv_params
                else {
                    "remote_engine_id": behaviour.engine_id,
                    "remote_block_ids": [[behaviour.prefills]],
                    "remote_host": behaviour.remote_host,
                    "remote_port": behaviour.remote_port,
                    "remote_request_id": request.headers.get("x-request-id"),
                }
            )
            if params is not None and behaviour.transfer_mode is not None:
                params.update(transfer_mode=behaviour.transfer_mode, tp_size=1, pp_size=1)
            if responses:
                return JSONResponse(response_object(body, "x", behaviour.cached_tokens, params))
            if messages:
                return JSONResponse(message_object(request, "x", behaviour.cached_tokens, params))
            return JSONResponse({"choices": [{"text": "x"}], "kv_transfer_params": params})
        text = f"decoded with {json.dumps(kv, sort_keys=True)}"
        if responses:
            if not body.get("stream"):
                return JSONResponse(response_object(body, text, behaviour.cached_tokens))
            return StreamingResponse(response_events(body, text, behaviour), media_type="text/event-stream")
        if messages:
            if not body.get("stream"):
                return JSONResponse(message_object(request, text, behaviour.cached_tokens))
            return StreamingResponse(message_events(request, text, behaviour), media_type="text/event-stream")
        if not body.get("stream") and behaviour.truncate_decodes > 0:
            behaviour.truncate_decodes -= 1  # a Content-Length the body never reaches: the connection drops
            return Response(b'{"choices": [', headers={"content-length": "1000"}, media_type="application/json")
        if not body.get("stream"):
            key = "message" if chat else "text"
            value = {"role": "assistant", "content": text} if chat else text
            return JSONResponse({"id": request.headers.get("x-request-id"), "choices": [{key: value}]})

        async def events():
            finished = False
            try:
                for index, word in enumerate(text.split(" ")):
                    if behaviour.break_stream_after is not None and index >= behaviour.break_stream_after:
                        raise RuntimeError("stand-in stream broken on purpose")
                    yield f"data: {json.dumps({'choices': [{'text': word + ' '}]})}\n\n".encode()
                    await asyncio.sleep(behaviour.stream_event_delay_s)
                yield b"data: [DONE]\n\n"
                finished = True
            finally:
                if not finished and behaviour.break_stream_after is None:
                    behaviour.streams_abandoned += 1

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handle(request, chat=True)

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await handle(request, chat=True, responses=True)

    @app.post("/v1/messages")
    async def messages(request: Request):
        return await handle(request, chat=True, messages=True)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        # Like vLLM's, for routing: a prompt's bytes (or a chat's JSON) as its token ids.
        body = await request.json()
        behaviour.tokenized.append(body)
        if behaviour.tokenize_delay_s:
            await asyncio.sleep(behaviour.tokenize_delay_s)
        if behaviour.tokenize is not None:
            tokens = behaviour.tokenize(body)
        else:
            text = body["prompt"] if "prompt" in body else json.dumps(body["messages"])
            tokens = list(text.encode())
        return JSONResponse(
            {"count": len(tokens), "max_model_len": 4096, "tokens": tokens}, status_code=behaviour.tokenize_status
        )

    async def render(request: Request, parts: tuple[str, ...]):
        body = await request.json()
        behaviour.rendered.append((request.url.path, body))
        if not behaviour.scale_out:  # as vllm/entrypoints/scale_out/factories.py answers then
            message = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
            return JSONResponse(
                {"error": {"message": message, "type": "PermissionDeniedError", "param": None, "code": 403}},
                status_code=403,
            )
        if behaviour.render_delay_s:
            await asyncio.sleep(behaviour.render_delay_s)
        if behaviour.render_reply is not None:
            return Response(behaviour.render_reply, status_code=behaviour.render_status, media_type="application/json")
        if behaviour.render_status != 200:
            return JSONResponse(
                {
                    "error": {
                        "message": f"stand-in {behaviour.render_status}",
                        "type": "X",
                        "code": behaviour.render_status,
                    }
                },
                behaviour.render_status,
            )
        # The rendered prompt: what changes it, in the order the template puts it.
        tokens = list(json.dumps([body.get(part) for part in parts]).encode())
        return JSONResponse(
            {
                "request_id": body.get("request_id") or "standin",
                "token_ids": tokens,
                "sampling_params": {"max_tokens": 16},
                "model": body.get("model"),
                "stream": bool(body.get("stream")),
                "kv_transfer_params": None,
            }
        )

    @app.post("/v1/responses/render")
    async def render_responses(request: Request):
        return await render(request, ("instructions", "input"))

    @app.post("/v1/messages/render")
    async def render_messages(request: Request):
        return await render(request, ("system", "messages"))

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await request.json()
        return JSONResponse({"prompt": bytes(body["tokens"]).decode(errors="replace")})

    @app.get("/version")
    async def version():
        return {"version": "standin-0"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "standin", "object": "model"}]}

    @app.get("/metrics")
    async def metrics(request: Request):
        behaviour.metrics_reads += 1
        if behaviour.metrics_status != 200:
            return Response(b"", status_code=behaviour.metrics_status)
        text = metrics_text(behaviour.worker_info, behaviour.features_off)
        if behaviour.kv_size_tokens is not None:
            text += (
                f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="{behaviour.kv_size_tokens // 16}"}}'
                f' 1.0\nvllm:kv_cache_usage_perc{{engine="0"}} {behaviour.kv_used}\n'
            )
        if "gzip" in request.headers.get("accept-encoding", ""):  # as prometheus-client's ASGI app does
            return Response(gzip.compress(text.encode()), media_type="text/plain", headers={"Content-Encoding": "gzip"})
        return Response(text, media_type="text/plain")

    @app.get("/health")
    async def health():
        return JSONResponse({}, status_code=200 if behaviour.healthy else 503)

    return app


def response_object(
    body: dict, text: str, cached_tokens: int, kv_transfer_params: dict | None = None, status: str = "completed"
) -> dict:
    """A Responses API reply as vLLM 0.32 writes one (the fields the proxy and clients read)."""
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    usage = {
        "input_tokens": 40,
        "output_tokens": len(text.split()),
        "total_tokens": 40 + len(text.split()),
        "input_tokens_details": {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0},
    }
    return {
        "id": body.get("request_id", "resp_standin"),
        "object": "response",
        "created_at": 0,
        "model": body.get("model"),
        "output": [message] if status != "in_progress" else [],
        "status": status,
        "usage": usage if status != "in_progress" else None,
        "kv_transfer_params": kv_transfer_params,
    }


async def response_events(body: dict, text: str, behaviour: StandinBehaviour):
    """A Responses event stream: the two events vLLM sends before its engine has the
    request, one delta per word, then `response.completed` with usage."""
    opening = response_object(body, "", 0, status="in_progress")
    events = [("response.created", {"response": opening}), ("response.in_progress", {"response": opening})]
    delta = {"item_id": "msg_1", "output_index": 0, "content_index": 0, "logprobs": []}
    events += [("response.output_text.delta", {**delta, "delta": word + " "}) for word in text.split(" ")]
    events.append(("response.completed", {"response": response_object(body, text, behaviour.cached_tokens)}))
    finished = False
    try:
        for number, (kind, payload) in enumerate(events):
            if behaviour.break_stream_after is not None and number >= behaviour.break_stream_after:
                raise RuntimeError("stand-in stream broken on purpose")
            data = json.dumps({**payload, "sequence_number": number, "type": kind})
            yield f"event: {kind}\ndata: {data}\n\n".encode()
            await asyncio.sleep(behaviour.stream_event_delay_s)
        finished = True
    finally:
        if not finished and behaviour.break_stream_after is None:
            behaviour.streams_abandoned += 1


def message_object(request: Request, text: str, cached_tokens: int, kv_transfer_params: dict | None = None) -> dict:
    """An Anthropic Messages reply as vLLM writes one (its id is chat's)."""
    return {
        "id": f"chatcmpl-{request.headers.get('x-request-id')}",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": "m",
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 40 - cached_tokens,
            "output_tokens": len(text.split()),
            "cache_read_input_tokens": cached_tokens,
        },
        "kv_transfer_params": kv_transfer_params,
    }


async def message_events(request: Request, text: str, behaviour: StandinBehaviour):
    """A Messages event stream: message_start (with usage), one text delta per word,
    message_delta (with usage), message_stop."""
    start = message_object(request, "", behaviour.cached_tokens)
    events = [
        ("message_start", {"message": {**start, "content": []}}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ]
    events += [
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": word + " "}})
        for word in text.split(" ")
    ]
    events += [
        ("content_block_stop", {"index": 0}),
        (
            "message_delta",
            {
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": message_object(request, text, behaviour.cached_tokens)["usage"],
            },
        ),
        ("message_stop", {}),
    ]
    for number, (kind, payload) in enumerate(events):
        if behaviour.break_stream_after is not None and number >= behaviour.break_stream_after:
            raise RuntimeError("stand-in stream broken on purpose")
        yield f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()
        await asyncio.sleep(behaviour.stream_event_delay_s)


def metrics_text(worker_info: dict | None, features_off: dict[str, str] | None = None) -> str:
    """A worker's /metrics: a vLLM-like series, then (if set) pdspec_worker_info and
    pdspec_engine_feature."""
    lines = [
        "# HELP vllm:num_requests_running Requests running.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0"} 0.0',
    ]
    if worker_info is not None:
        labels = ",".join(f'{name}="{value}"' for name, value in worker_info.items())
        lines += [
            "# HELP pdspec_worker_info Worker config.",
            "# TYPE pdspec_worker_info gauge",
            f"pdspec_worker_info{{{labels}}} 1.0",
        ]
    if features_off:
        lines += [
            "# HELP pdspec_engine_feature Engine features.",
            "# TYPE pdspec_engine_feature gauge",
            'pdspec_engine_feature{feature="k0_rule",reason="",state="on"} 1.0',
        ]
        lines += [
            f'pdspec_engine_feature{{feature="{name}",reason="{reason}",state="off"}} 1.0'
            for name, reason in features_off.items()
        ]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proxy_server(settings) -> ThreadServer:
    """A real proxy for `settings` (ProxySettings), served as `pdspec proxy` serves it: its
    own client protocol and uvicorn options (proxy/serve.py); not yet entered."""
    from proxy.app import create_app
    from proxy.serve import uvicorn_options

    app = create_app(settings)
    options = uvicorn_options(settings, app)
    del options["host"], options["port"]  # the ThreadServer's own
    return ThreadServer(app, **options)


def unused_port(low: int = 31000, high: int = 39999) -> int:
    """A port in low..high that nothing is bound to now, for a server of another process,
    which binds it itself (unlike ThreadServer's, the port may be taken in between: rare,
    the search starts at random, and the server then fails to start, named)."""
    start = random.randrange(low, high + 1)
    for offset in range(high - low + 1):
        port = low + (start - low + offset) % (high - low + 1)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


class ThreadServer:
    """An ASGI app under uvicorn in a background thread, on a free loopback port."""

    def __init__(self, app, **config) -> None:
        # The listening socket is bound here and handed to uvicorn, so no other process
        # (the unit tests run in several) can take the port between picking and binding it.
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, **{"log_level": "warning", **config})
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:  # uvicorn sets this once it listens
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


class InstantWorkerThread:
    """The benchmarks' instant worker (loadtest/micro/instant_worker.py) on its own event loop
    in a background thread, on a free loopback port bound before it serves."""

    def __init__(self, worker: InstantWorker | None = None) -> None:
        self.worker = worker or InstantWorker()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> InstantWorkerThread:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(start_server(self.worker, sock=self.sock), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.server.close)  # kept-alive connections end with the loop
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
        self.sock.close()
