"""Run the proxy under uvicorn (uvloop and httptools, which uvicorn[standard] brings), with the
client connection limits of proxy/edge/connections.py."""

from __future__ import annotations

import uvicorn

from pdspec.settings import ProxySettings
from proxy.app import create_app
from proxy.edge.connections import ClientLimits, limited_protocol
from proxy.logs import configure_logging


def client_limits(settings: ProxySettings) -> ClientLimits:
    return ClientLimits(
        max_header_bytes=settings.client_max_header_bytes,
        head_timeout_s=settings.client_head_timeout_s,
        body_timeout_s=settings.client_body_timeout_s,
        idle_timeout_s=settings.client_idle_timeout_s,
        max_connections=settings.max_connections,
    )


def serve(settings: ProxySettings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    refusals = app.state.metrics.client_refusals
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # keep the handlers set above: uvicorn's lines get request ids too
        access_log=False,  # the proxy logs requests itself, with their ids
        proxy_headers=False,  # client addresses are never used; skip X-Forwarded-* per request
        loop="auto",
        http=limited_protocol(client_limits(settings), lambda reason: refusals.labels(reason).inc()),
        timeout_keep_alive=settings.client_idle_timeout_s,
        timeout_graceful_shutdown=5,
    )
