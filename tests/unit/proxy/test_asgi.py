"""proxy/asgi.py: the connection a request is told about, and the disconnect watch built on
it (or, under another ASGI server, on `receive()`)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.asgi import ClientConnection, DisconnectWatch


def test_a_lost_connection_runs_each_callback_once():
    connection, calls = ClientConnection(), []
    connection.on_lost(lambda: calls.append("a"))
    connection.on_lost(lambda: calls.append("b"))
    connection.lost()
    connection.lost()
    assert sorted(calls) == ["a", "b"]


def test_a_forgotten_callback_does_not_run():
    connection, calls = ClientConnection(), []

    def callback():
        calls.append(1)

    connection.on_lost(callback)
    connection.forget(callback)
    connection.lost()
    assert calls == []


def test_registering_on_a_lost_connection_runs_at_once():
    connection, calls = ClientConnection(), []
    connection.lost()
    connection.on_lost(lambda: calls.append(1))
    assert calls == [1]


async def never_receives():
    await asyncio.Event().wait()


def test_with_a_connection_no_watcher_task_runs_and_a_loss_cancels_the_request():
    async def request(connection):
        watch = DisconnectWatch(never_receives, None, connection)
        tasks = len(asyncio.all_tasks())
        asyncio.get_running_loop().call_soon(connection.lost)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(10)
        return watch.disconnected, tasks

    async def main():
        connection = ClientConnection()
        return await asyncio.create_task(request(connection)), connection

    (disconnected, tasks), connection = asyncio.run(main())
    assert disconnected and tasks == 2  # main and the request: no watcher
    assert not connection._callbacks


def test_a_loss_after_the_reply_cancels_nothing():
    async def main():
        connection = ClientConnection()
        watch = DisconnectWatch(never_receives, None, connection)
        watch.stop()
        connection.lost()
        await asyncio.sleep(0)
        return watch.disconnected

    assert asyncio.run(main()) is False


def test_without_a_connection_a_watcher_reads_the_disconnect():
    async def request(messages: asyncio.Queue):
        watch = DisconnectWatch(messages.get, None)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(10)
        return watch.disconnected

    async def main():
        messages = asyncio.Queue()
        task = asyncio.create_task(request(messages))
        await asyncio.sleep(0)
        messages.put_nowait({"type": "http.disconnect"})
        return await task

    assert asyncio.run(main()) is True
