"""loadtest/serving/hostile_clients.py's hostile connections: one the proxy closes is opened
again while its phase runs, and none outlives its phase waiting for the proxy to close it."""

from __future__ import annotations

import asyncio

import pytest

from loadtest.serving.hostile_clients import Phase, _hold, idle, slow_head
from tests.polling import until

pytestmark = pytest.mark.asyncio


async def serve(on_connect) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_connection_the_proxy_never_closes_ends_with_its_phase():
    held: list[asyncio.StreamWriter] = []

    async def never_close(reader, writer):
        held.append(writer)  # a proxy whose timeouts have not fired yet

    server, port = await serve(never_close)
    phase, stop = Phase("attack", 1), asyncio.Event()
    task = asyncio.create_task(_hold("127.0.0.1", port, idle, phase, stop))
    await until(lambda: held)
    stop.set()
    await asyncio.wait_for(task, timeout=5)  # not the 60 s a closing proxy would get
    assert phase.hostile_connections == 1
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_a_slow_head_the_proxy_closes_is_opened_again_while_the_phase_runs():
    async def refuse(reader, writer):
        writer.close()

    server, port = await serve(refuse)
    phase, stop = Phase("attack", 1), asyncio.Event()
    task = asyncio.create_task(_hold("127.0.0.1", port, slow_head, phase, stop))
    # Each write after the close fails, and it connects again.
    await until(lambda: phase.hostile_connections >= 3, timeout_s=10)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    server.close()
    await server.wait_closed()
