"""The proxy's app factory: `create_app(settings)` returns a configured FastAPI app."""

from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from pdspec.settings import ProxySettings
from proxy.disagg import Disaggregator
from proxy.errors import ProxyError, error_response
from proxy.metrics import ProxyMetrics
from proxy.pool import WorkerPool
from proxy.validation import ChatCompletionRequest, CompletionRequest, parse_json_object, validate

log = logging.getLogger("pdspec.proxy")


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProxyError(413, f"Request body is larger than {limit} bytes.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProxyError(413, f"Request body is larger than {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(settings: ProxySettings) -> FastAPI:
    metrics = ProxyMetrics.create()
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=30, keepalive_timeout=30)
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout_s),
            json_serialize=_dumps,
        )
        state["disaggregator"] = Disaggregator(
            session=session,
            prefill_pool=WorkerPool.from_urls("prefill", settings.prefill_urls),
            decode_pool=WorkerPool.from_urls("decode", settings.decode_urls),
            metrics=metrics,
            prefill_timeout=aiohttp.ClientTimeout(total=settings.prefill_timeout_s, connect=settings.connect_timeout_s),
            decode_timeout=aiohttp.ClientTimeout(
                total=settings.decode_timeout_s, connect=settings.connect_timeout_s
            ),
        )
        state["session"] = session
        try:
            yield
        finally:
            await session.close()

    app = FastAPI(title="pdspec proxy", lifespan=lifespan)
    app.state.metrics = metrics

    @app.exception_handler(ProxyError)
    async def proxy_error_handler(request: Request, exc: ProxyError) -> Response:
        return error_response(exc, headers=_id_header(request))

    async def disaggregated(request: Request, path: str, chat: bool) -> Response:
        endpoint = "chat" if chat else "completions"
        request_id = _request_id(request)
        try:
            raw = await read_body(request, settings.max_body_bytes)
            body = parse_json_object(raw)
            validate(body, ChatCompletionRequest if chat else CompletionRequest)
            response = await state["disaggregator"].serve(path, body, chat, request_id)
        except ProxyError as exc:
            metrics.requests.labels(endpoint, str(exc.status)).inc()
            raise
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await disaggregated(request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await disaggregated(request, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models() -> Response:
        worker = state["disaggregator"].decode_pool.pick()
        try:
            async with state["session"].get(worker.url + "/v1/models") as resp:
                return Response(await resp.read(), status_code=resp.status, media_type="application/json")
        except aiohttp.ClientError as exc:
            raise ProxyError(502, f"decode worker {worker.url} failed: {type(exc).__name__}") from exc

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _request_id(request: Request) -> str:
    """The client's X-Request-Id if it is sane, else a new one; kept for error replies."""
    incoming = request.headers.get("x-request-id")
    valid = incoming and len(incoming) <= 128 and incoming.isascii() and incoming.isprintable()
    rid = incoming if valid else uuid.uuid4().hex
    request.state.request_id = rid
    return rid


def _id_header(request: Request) -> dict[str, str]:
    rid = getattr(request.state, "request_id", None)
    return {"X-Request-Id": rid} if rid else {}


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, separators=(",", ":"))
