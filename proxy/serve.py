"""Run the proxy under uvicorn (uvloop and httptools, which uvicorn[standard] brings), with the
client connection limits of proxy/edge/connections.py."""

from __future__ import annotations

import uvicorn

from pdspec.settings import ProxySettings
from proxy.app import create_app
from proxy.edge.connections import ClientLimits, limited_protocol
from proxy.logs import configure_logging


def server_options(settings: ProxySettings, app) -> dict:
    """uvicorn's options for the proxy `app` (from `create_app(settings)`): its client
    protocol with the `clients` group's limits, and nothing per request the proxy does not
    use. The unit tests serve their proxies with these too."""
    refusals = app.state.metrics.client_refusals
    return {
        "log_level": settings.observability.log_level,
        "log_config": None,  # keep the handlers configure_logging set: uvicorn's lines get request ids too
        "access_log": False,  # the proxy logs requests itself, with their ids
        "proxy_headers": False,  # client addresses are never used; skip X-Forwarded-* per request
        "loop": "auto",
        "http": limited_protocol(
            ClientLimits.from_settings(settings.clients), lambda reason: refusals.labels(reason).inc()
        ),
        "timeout_keep_alive": settings.clients.idle_timeout_s,
        "timeout_graceful_shutdown": 5,
    }


def serve(settings: ProxySettings) -> None:
    configure_logging(settings.observability.log_level, settings.observability.log_format)
    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, **server_options(settings, app))
