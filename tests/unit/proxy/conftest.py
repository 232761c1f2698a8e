"""Event loops for the proxy's unit tests: the HTTP client's tests (upstream/test_client.py) run
on asyncio's loop and on uvloop, which the proxy runs on under uvicorn (`loop="auto"`):
their transports differ where the client meets a dying worker. The rest: asyncio's."""

import asyncio

import uvloop

BOTH_LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
ASYNCIO_ONLY = {"asyncio": asyncio.new_event_loop}


def pytest_asyncio_loop_factories(config, item):
    return BOTH_LOOPS if item.module.__name__.endswith(".upstream.test_client") else ASYNCIO_ONLY
