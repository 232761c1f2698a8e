"""Run the proxy under uvicorn (uvloop and httptools, which uvicorn[standard] brings), with the
client connection limits of proxy/edge/connections.py.

`serve`: the proxy as one process (`proxy.workers` = 1), uvicorn binding its port.
`serve_process`: one of several processes on one port (proxy/processes.py starts them and
binds their sockets), the same server given its sockets, the shared metrics, and a call
once it listens.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn

from pdspec.settings import ProxySettings
from proxy.app import ProxyApp, create_app
from proxy.edge.connections import ClientLimits, limited_protocol
from proxy.logs import configure_logging
from proxy.shared_metrics import SharedMetrics

# With observability.served_by_headers, one of several processes names itself (its index,
# 0 to workers - 1) on every reply: which process served a request.
PROCESS_HEADER = "X-Pdspec-Proxy-Process"
# Requests still running when the proxy is told to stop get this long to end.
GRACEFUL_SHUTDOWN_S = 5


def uvicorn_options(settings: ProxySettings, app: ProxyApp) -> dict:
    """uvicorn's configuration of the proxy, one process or several."""
    refusals = app.state.metrics.client_refusals
    return dict(
        host=settings.host,
        port=settings.port,
        log_level=settings.observability.log_level,
        log_config=None,  # keep the handlers configure_logging set: uvicorn's lines get request ids too
        access_log=False,  # the proxy logs requests itself, with their ids
        proxy_headers=False,  # client addresses are never used; skip X-Forwarded-* per request
        loop="auto",
        http=limited_protocol(
            ClientLimits.from_settings(settings.clients), lambda reason: refusals.labels(reason).inc()
        ),
        timeout_keep_alive=settings.clients.idle_timeout_s,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


def serve(settings: ProxySettings) -> None:
    configure_logging(settings.observability.log_level, settings.observability.log_format)
    app = create_app(settings)
    uvicorn.run(app, **uvicorn_options(settings, app))


def serve_process(
    settings: ProxySettings,
    index: int,
    sockets: list[socket.socket],
    metrics_dir: Path,
    listening: Callable[[], None],
) -> None:
    """Serve as process `index` of several, on `sockets` (bound, not yet listening: uvicorn
    listens once the app's start-up, which admits the workers that are up, is done, so the
    kernel hands this process no connection before it can route one). `settings` are this
    process's own (its share of the limits); `listening` is called once it listens."""
    configure_logging(settings.observability.log_level, settings.observability.log_format)
    app = create_app(settings, SharedMetrics(metrics_dir))
    headers = [(PROCESS_HEADER, str(index))] if settings.observability.served_by_headers else []
    config = uvicorn.Config(app, headers=headers, **uvicorn_options(settings, app))
    _ListeningServer(config, listening).run(sockets=sockets)


class _ListeningServer(uvicorn.Server):
    """uvicorn's server, calling `listening` once it listens."""

    def __init__(self, config: uvicorn.Config, listening: Callable[[], None]) -> None:
        super().__init__(config)
        self.listening = listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.listening()
