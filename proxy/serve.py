"""Run the proxy under uvicorn (uvloop and httptools, which uvicorn[standard] brings)."""

from __future__ import annotations

import uvicorn

from pdspec.settings import ProxySettings
from proxy.app import create_app
from proxy.logs import configure_logging


def serve(settings: ProxySettings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # keep the handlers set above: uvicorn's lines get request ids too
        access_log=False,  # the proxy logs requests itself, with their ids
        proxy_headers=False,  # client addresses are never used; skip X-Forwarded-* per request
        loop="auto",
        http="auto",
        timeout_graceful_shutdown=5,
    )
