"""The proxy's app factory: `create_app(settings)` returns a configured FastAPI app."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from pdspec.settings import ProxySettings
from proxy.admission import Admission
from proxy.auth import ApiKeys
from proxy.disagg import Disaggregator
from proxy.errors import ProxyError, error_response
from proxy.health import HealthChecker
from proxy.membership import Membership
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


async def until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(request: Request, work) -> Any:
    """Run `work` unless the client goes away first; then cancel it, which closes the
    worker connections so vLLM aborts the request and frees its KV blocks."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ProxyError(499, "Client closed the request.", code="client_closed_request")
    return task.result()


def create_app(settings: ProxySettings) -> FastAPI:
    metrics = ProxyMetrics.create()
    prefill_pool = WorkerPool.from_urls("prefill", [], settings.prefill_policy)
    decode_pool = WorkerPool.from_urls("decode", [], settings.decode_policy)
    membership = Membership(
        {prefill_pool: settings.prefill_urls, decode_pool: settings.decode_urls}, settings.dns_refresh_s
    )
    admission = Admission(settings.max_inflight, settings.max_queue, settings.queue_timeout_s, settings.retry_after_s)
    api_keys = ApiKeys(settings.api_keys)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=30, keepalive_timeout=30)
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout_s),
            json_serialize=lambda obj: json.dumps(obj, separators=(",", ":")),
        )
        await membership.refresh()
        checker = HealthChecker(
            session, [prefill_pool, decode_pool], settings.health_interval_s, settings.health_timeout_s,
            settings.eject_after_failures, settings.readmit_after_successes,
        )  # fmt: skip
        await checker.check_all()  # admit the workers that are up before serving
        state["session"] = session
        state["limits"] = await fetch_model_limits(session, decode_pool)
        state["disaggregator"] = Disaggregator(session, prefill_pool, decode_pool, metrics, settings)
        state["checker"] = checker
        tasks = [asyncio.create_task(checker.run()), asyncio.create_task(membership.run())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await session.close()

    app = FastAPI(title="pdspec proxy", lifespan=lifespan)
    app.state.metrics = metrics
    app.state.pools = (prefill_pool, decode_pool)
    app.state.admission = admission

    @app.exception_handler(ProxyError)
    async def proxy_error_handler(request: Request, exc: ProxyError) -> Response:
        return error_response(exc, headers=_id_header(request))

    async def disaggregated(request: Request, path: str, chat: bool) -> Response:
        endpoint = "chat" if chat else "completions"
        request_id = _request_id(request)
        try:
            api_keys.check(request.headers.get("authorization"))
            raw = await read_body(request, settings.max_body_bytes)
            body = parse_json_object(raw)
            validate(body, ChatCompletionRequest if chat else CompletionRequest)
            if not state.get("limits"):  # workers were not up when the proxy started
                state["limits"] = await fetch_model_limits(state["session"], decode_pool)
            check_limits(body, state["limits"])
            async with admission.slot():
                metrics.inflight.set(admission.inflight)
                response = await cancel_on_disconnect(
                    request, state["disaggregator"].serve(path, body, chat, request_id)
                )
        except ProxyError as exc:
            metrics.requests.labels(endpoint, str(exc.status)).inc()
            log.info("request %s -> %d %s", request_id, exc.status, exc.message)
            raise
        finally:
            metrics.inflight.set(admission.inflight)
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await disaggregated(request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await disaggregated(request, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        api_keys.check(request.headers.get("authorization"))
        disaggregator: Disaggregator = state["disaggregator"]
        worker = decode_pool.pick()
        try:
            async with state["session"].get(worker.url + "/v1/models", headers=disaggregator.worker_headers) as resp:
                return Response(await resp.read(), status_code=resp.status, media_type="application/json")
        except aiohttp.ClientError as exc:
            raise ProxyError(502, f"decode worker {worker.url} failed: {type(exc).__name__}") from exc

    @app.get("/health")
    async def health() -> JSONResponse:
        """Liveness: the proxy itself answers."""
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: at least one healthy prefill and one healthy decode worker."""
        status = {pool.name: sum(w.healthy for w in pool.workers) for pool in (prefill_pool, decode_pool)}
        ok = all(count > 0 for count in status.values())
        return JSONResponse({"ready": ok, "healthy_workers": status}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        for pool in (prefill_pool, decode_pool):
            metrics.healthy_workers.labels(pool.name).set(sum(w.healthy for w in pool.workers))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def fetch_model_limits(session: aiohttp.ClientSession, pool: WorkerPool) -> dict[str, int]:
    """max_model_len per served model, from a decode worker's /v1/models (vLLM lists it).

    A request the decode worker would refuse must be refused before its prefill leg:
    otherwise the prefill worker keeps the prompt's KV for a decode that never comes."""
    for worker in pool.healthy():
        try:
            async with session.get(worker.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                cards = (await resp.json(content_type=None)).get("data", [])
            return {card["id"]: int(card["max_model_len"]) for card in cards if card.get("max_model_len")}
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError):
            continue
    return {}


def check_limits(body: dict, limits: dict[str, int]) -> None:
    max_len = limits.get(body.get("model"))
    if max_len is None:
        return
    for field in ("max_tokens", "max_completion_tokens"):
        value = body.get(field)
        if isinstance(value, int) and value >= max_len:
            raise ProxyError(400, f"'{field}' is {value}, but the model's context is {max_len} tokens.", param=field)


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
