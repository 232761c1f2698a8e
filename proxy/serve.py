"""Run the proxy under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from pdspec.settings import ProxySettings
from proxy.app import create_app


def serve(settings: ProxySettings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        loop="auto",
        http="auto",
        timeout_graceful_shutdown=5,
    )
