"""The proxy's app factory: `create_app(settings)` returns a configured FastAPI app.

The generation endpoints (proxy/apis/registry.py: completions, chat, responses, messages) are
plain ASGI (`OpenAIEndpoint`, proxy/edge/endpoint.py), served ahead of FastAPI's middleware
and routing (`ProxyApp`): they are the hot path, and FastAPI's per-request machinery cost
more than both worker legs together (profiled under loadtest/micro/proxy_bench.py).
Everything else (/v1/models, /health, /ready, /metrics, the stored-response routes that
answer 404) is ordinary FastAPI.

One app is one process. With `proxy.workers` > 1 each process runs its own (proxy/processes.py),
given `SharedMetrics`: its /metrics and /load then answer for every process, and the gauges
it reads off its pools are also written every `SHARED_GAUGES_INTERVAL_S`, so a scrape of
another process finds this one's fresh.
"""

from __future__ import annotations

import asyncio
import gc
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import URL
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, RedirectResponse, Response

from pdspec.settings import ProxySettings
from proxy.admission.kv_room import KvRoom
from proxy.admission.queue import Admission
from proxy.apis.limits import ModelLimits
from proxy.apis.registry import APIS
from proxy.auth import ApiKeys, worker_auth_headers
from proxy.edge.endpoint import OpenAIEndpoint
from proxy.edge.passthrough import add_passthrough_routes
from proxy.errors import ProxyError, error_response
from proxy.fleet.health import HealthChecker
from proxy.fleet.membership import Membership
from proxy.fleet.pairing import Pairing
from proxy.fleet.pool import WorkerPool
from proxy.flow.disagg import Disaggregator
from proxy.loop_lag import LoopLag
from proxy.metrics import ProxyMetrics
from proxy.routing import registry as policies
from proxy.routing.kv_router import KvRouter
from proxy.shared_metrics import SharedMetrics
from proxy.tracing import Tracing
from proxy.upstream.client import UpstreamClient

# vLLM's scale-out endpoints (vllm/entrypoints/scale_out/, `--enable-scale-out`), on the
# workers: never served to clients, whatever the method.
SCALE_OUT_PATHS = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/responses/render",
    "/v1/messages/render",
    "/v1/chat/completions/derender",
    "/v1/completions/derender",
    "/inference/v1/generate",
)
SCALE_OUT_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# One of several processes: how often it writes the gauges it reads off its pools (worker
# legs in flight, healthy and refused workers, queued requests) for the others' scrapes.
SHARED_GAUGES_INTERVAL_S = 1.0


class HotPaths:
    """ASGI: requests for these exact paths go straight to their endpoint; the same path
    with a trailing slash is redirected to it (307, the method and body kept), as vLLM's
    router (Starlette's `redirect_slashes`) answers."""

    def __init__(self, app, endpoints: dict[str, OpenAIEndpoint]) -> None:
        self.app = app
        self.endpoints = endpoints

    async def __call__(self, scope, receive, send) -> None:
        endpoint = self.endpoints.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is not None:
            await endpoint(scope, receive, send)
        elif scope["type"] == "http" and scope["path"].endswith("/") and scope["path"][:-1] in self.endpoints:
            location = URL(scope=scope).replace(path=scope["path"][:-1])
            await RedirectResponse(str(location), status_code=307)(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class ProxyApp(FastAPI):
    """FastAPI with the OpenAI generation endpoints in front of its whole middleware
    stack (its error middleware alone wraps every send); they answer errors themselves."""

    def __init__(self, hot_paths: dict[str, OpenAIEndpoint], **kwargs) -> None:
        super().__init__(**kwargs)
        self.hot_paths = hot_paths

    def build_middleware_stack(self):
        return HotPaths(super().build_middleware_stack(), self.hot_paths)


def create_app(settings: ProxySettings, shared: SharedMetrics | None = None) -> ProxyApp:
    """The proxy's app; `shared`: it is one of several processes (proxy/processes.py)."""
    metrics = ProxyMetrics.create(shared=shared is not None)
    routing = settings.routing
    prefill_pool = WorkerPool.from_urls("prefill", [], policies.for_pool(routing, "prefill"))
    decode_pool = WorkerPool.from_urls("decode", [], policies.for_pool(routing, "decode"))
    membership = Membership(
        {prefill_pool: settings.prefill_urls, decode_pool: settings.decode_urls}, settings.dns_refresh_s
    )
    admission = Admission.from_settings(settings.admission)
    if shared is None:  # shared, the files hold what `set` wrote, never a function's value
        metrics.queued.set_function(lambda: admission.waiting)  # read at scrape time: nothing on the request path
    api_keys = ApiKeys(settings.clients.api_keys)
    client = UpstreamClient.from_settings(settings.worker_client)
    worker_headers = worker_auth_headers(settings.worker_client.api_key)
    kv_router = (
        KvRouter(routing, client, prefill_pool, decode_pool, metrics, worker_headers)
        if KvRouter.wanted(routing)
        else None
    )
    kv_room = (
        KvRoom.from_settings(client, prefill_pool, settings.admission, metrics, worker_headers, settings.queue_budget())
        if settings.admission.prefill_kv
        else None
    )
    # The flow spans groups: retries, the legs' deadlines, the KV hand-off, served-by headers.
    disaggregator = Disaggregator(client, prefill_pool, decode_pool, metrics, settings, kv_router, kv_room)
    limits = ModelLimits(client, decode_pool, disaggregator.worker_headers)
    tracing = Tracing(settings.observability.otlp_traces_endpoint)
    for role, replicas in (settings.observability.plan_replicas or {}).items():
        metrics.plan_replicas.labels(role).set(replicas)
    pairing = Pairing.from_settings(
        settings.health, lambda pool, field: metrics.pairing_refusals.labels(pool, field).inc()
    )
    loop_lag = LoopLag(metrics.loop_lag)
    checker = HealthChecker.from_settings(
        client,
        [prefill_pool, decode_pool],
        settings.health,
        pairing,
        loop_lag,
        metrics.health_checks_discarded.inc,
        after_round=kv_router.sync if kv_router else None,
    )

    def set_pool_gauges() -> None:
        """The gauges read off the pools rather than kept on the request path."""
        metrics.set_series(
            metrics.worker_inflight,  # workers may have left the pool since
            {(pool.name, w.url): w.outstanding for pool in (prefill_pool, decode_pool) for w in pool.workers},
        )
        for pool in (prefill_pool, decode_pool):
            metrics.healthy_workers.labels(pool.name).set(len(pool.healthy()))
            refused = sum(w.healthy and w.refusal is not None for w in pool.workers)
            metrics.refused_workers.labels(pool.name).set(refused)
        metrics.decode_pending_tokens.set(decode_pool.decode_pending_tokens)
        if shared is not None:
            metrics.queued.set(admission.waiting)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await membership.refresh()
        await checker.check_all()  # admit the workers that are up before serving
        await limits.fetch()
        tasks = [asyncio.create_task(t) for t in (checker.run(), membership.run(), loop_lag.run())]
        if shared is not None:
            set_pool_gauges()  # before this process takes connections: the first scrape sees it
            tasks.append(asyncio.create_task(every(SHARED_GAUGES_INTERVAL_S, set_pool_gauges)))
        if kv_room is not None:
            metrics.kv_room_waits.labels("admitted")
            metrics.kv_room_waits.labels("timeout")
            tasks.append(asyncio.create_task(kv_room.run()))
        # Everything built so far lives as long as the proxy: keep it out of the garbage
        # collector's view. The request path makes no reference cycles, so the automatic
        # collector's passes (which scale with the objects of every request in flight, and
        # were most of the p99 under load) are replaced by one pass every `gc_interval_s`
        # for the cycles that rarer paths (errors, cancellations) leave.
        gc.collect()
        gc.freeze()
        if settings.gc_interval_s > 0:
            gc.disable()
            tasks.append(asyncio.create_task(collect_garbage(settings.gc_interval_s)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if kv_router is not None:
                await kv_router.close()
            client.close()
            tracing.shutdown()

    endpoints = {
        api.path: OpenAIEndpoint(
            api,
            settings.clients,
            api_keys,
            admission,
            limits,
            disaggregator,
            metrics,
            tracing,
            access_log=settings.observability.access_log,
        )
        for api in APIS
    }
    # FastAPI's /docs, /redoc and /openapi.json describe the proxy's routes to anyone who
    # asks; a browser's docs page cannot send a Bearer key, so with API keys set they are
    # switched off (404) rather than half-working behind the key.
    docs = {} if not api_keys.enabled else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = ProxyApp(endpoints, title="pdspec proxy", lifespan=lifespan, **docs)
    app.state.metrics = metrics
    app.state.pools = (prefill_pool, decode_pool)
    app.state.admission = admission
    app.state.kv_router = kv_router

    @app.exception_handler(ProxyError)
    async def proxy_error_handler(request: Request, exc: ProxyError) -> Response:
        return error_response(exc)

    add_passthrough_routes(
        app,
        client,
        decode_pool,
        api_keys,
        disaggregator.worker_headers,
        settings.health.timeout_s,
        settings.clients.max_body_bytes,
    )

    @app.exception_handler(StarletteHTTPException)
    async def http_error_handler(request: Request, exc: StarletteHTTPException) -> Response:
        # Unknown paths (404) and methods (405, with its Allow header) in OpenAI's format too.
        message = {
            404: f"No route {request.url.path}.",
            405: f"Method {request.method} is not allowed on {request.url.path}.",
        }.get(exc.status_code, exc.detail)
        return error_response(ProxyError(exc.status_code, str(message)), headers=dict(exc.headers or {}))

    async def scale_out_path(request: Request) -> Response:
        """vLLM's scale-out endpoints (render, derender, /inference/v1/generate) are the
        workers' own: the proxy reads render for cache-aware routing
        (proxy/routing/tokens.py) and serves none of them to clients. A plain 404 as for an
        unknown path, whatever the method (`/v1/responses/render` would otherwise match
        the stored-response routes below and answer 405 to a POST)."""
        raise ProxyError(404, f"No route {request.url.path}.", code="not_found")

    for path in SCALE_OUT_PATHS:
        app.add_api_route(path, scale_out_path, methods=list(SCALE_OUT_METHODS), include_in_schema=False)

    @app.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"])
    @app.api_route("/v1/responses/{response_id}/{action}", methods=["GET", "POST"])
    async def stored_response(request: Request, response_id: str, action: str | None = None) -> Response:
        """Retrieve, delete, cancel, input items: none applies, since no response is stored
        through the proxy (proxy/apis/responses.py says why)."""
        api_keys.check(request.headers.get("authorization"))
        raise ProxyError(
            404,
            f"Response {response_id!r} is not stored: through this P/D proxy responses are never "
            "stored (one would live only on the decode worker that produced it).",
        )

    @app.get("/health")
    async def health() -> JSONResponse:
        """Liveness: the proxy itself answers."""
        return JSONResponse({"status": "ok"})

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        """vLLM's liveness route for SageMaker-style checks (an empty 200), as /health."""
        return Response(status_code=200)

    @app.get("/load")
    async def load() -> JSONResponse:
        """vLLM's `/load`: the requests this proxy is serving now (admitted, not queued), in
        all its processes."""
        if shared is None:
            return JSONResponse({"server_load": admission.inflight})
        return JSONResponse({"server_load": int(shared.value("pdspec_proxy_inflight_requests") or 0)})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: at least one healthy, admitted prefill and decode worker; the pairing
        check's view (reference config, refused, unverified and pending workers). One of
        several processes answers from its own checks, the ones it routes by: every process
        checks the same workers with the same settings, so their answers differ only around
        a change (one ejects a worker a check before another), and none listens before its
        first round of checks."""
        pools = [prefill_pool, decode_pool]
        status = {pool.name: len(pool.healthy()) for pool in pools}
        ok = all(count > 0 for count in status.values())
        pairing_status = pairing.status(pools)
        body: dict = {
            "ready": ok,
            "healthy_workers": status,
            "pairing": pairing_status,
            "engine_features_off": features_off(pools),
        }
        if not ok:
            body["reason"] = not_ready_reason(status, pairing_status)
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        set_pool_gauges()
        body = generate_latest(metrics.registry) if shared is None else shared.exposition()
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app


def features_off(pools: list[WorkerPool]) -> list[dict]:
    """For /ready: each healthy worker's engine features that are off (pdspec_engine_feature),
    such as a prefill worker whose K=0 steps run the full drafter pass. Not a reason to be
    unready: the worker still serves correctly, only slower."""
    return [
        {"pool": pool.name, "worker": w.url, "feature": name, "reason": reason}
        for pool in pools
        for w in pool.workers
        if w.healthy
        for name, reason in w.features_off.items()
    ]


def not_ready_reason(healthy: dict[str, int], pairing_status: dict) -> str:
    """One sentence for /ready: which pool has no worker to route to, and why."""
    parts = []
    for pool, count in healthy.items():
        if count:
            continue
        why = [
            f"{r['worker']} refused: "
            + ", ".join(f"{name} {d['worker']!r} vs {d['reference']!r}" for name, d in r["fields"].items())
            + f" of {r['against']}"
            for r in pairing_status["refused"]
            if r["pool"] == pool
        ] + [
            f"{p['worker']} waiting for its pdspec_worker_info ({p['error']})"
            for p in pairing_status["pending"]
            if p["pool"] == pool
        ]
        parts.append(f"no admitted {pool} worker" + (f" ({'; '.join(why)})" if why else ""))
    return "; ".join(parts)


async def every(interval_s: float, update) -> None:
    """Calls `update()` every `interval_s` until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        update()


async def collect_garbage(interval_s: float) -> None:
    try:
        await every(interval_s, gc.collect)
    finally:
        gc.enable()
