"""proxy/admission/queue.py: at most `max_inflight` requests run and at most `max_queue` wait;
the rest get 429 with Retry-After at once, and a waiter that times out gets 503. Then
its use in proxy/edge/endpoint.py: the reply a refused client sees, and the slot given back when a
request ends, served or failed.

The module tests drive the queue step by step; the app tests run the proxy in the
test's own event loop (ASGI, lifespan included) in front of a stand-in worker, so the
test can hold the proxy's slot itself."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import httpx
import pytest

from pdspec.settings import ProxySettings
from proxy.admission.queue import Admission
from proxy.app import create_app
from proxy.asgi import Reply
from proxy.errors import ProxyError
from tests.harness import merged
from tests.standin import StandinBehaviour, ThreadServer, create_standin

GUARD_S = 5  # only against a hang
BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}


async def settle(condition) -> None:
    """Let the other tasks run until `condition()` holds (each step yields to the loop
    once; no clock involved)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def queue(admission: Admission, order: list, name: str) -> asyncio.Task:
    async def wait_for_a_slot():
        await admission.acquire()
        order.append(name)

    return asyncio.create_task(wait_for_a_slot())


# The module


async def test_up_to_max_inflight_are_admitted_at_once():
    admission = Admission(max_inflight=2, max_queue=0, queue_timeout_s=GUARD_S, retry_after_s=1)
    await admission.acquire()
    await admission.acquire()
    assert (admission.inflight, admission.waiting) == (2, 0)


async def test_beyond_the_queue_is_429_at_once_with_retry_after():
    admission = Admission(max_inflight=1, max_queue=0, queue_timeout_s=GUARD_S, retry_after_s=7)
    await admission.acquire()
    with pytest.raises(ProxyError) as refused:
        await admission.acquire()
    exc = refused.value
    assert (exc.status, exc.code, exc.headers) == (429, "rate_limit_exceeded", {"Retry-After": "7"})
    assert (admission.inflight, admission.waiting) == (1, 0)
    # As the endpoint sends it: the OpenAI error format, Retry-After and the request id.
    reply = Reply.error(exc, "rid-1")
    assert reply.status == 429 and reply.headers == {"Retry-After": "7", "X-Request-Id": "rid-1"}
    assert json.loads(reply.body) == {
        "error": {
            "message": "Too many requests in flight; retry later.",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


async def test_the_queue_holds_max_queue_and_is_served_in_order():
    admission = Admission(max_inflight=1, max_queue=2, queue_timeout_s=GUARD_S, retry_after_s=1)
    await admission.acquire()
    order: list[str] = []
    first, second = queue(admission, order, "first"), queue(admission, order, "second")
    await settle(lambda: admission.waiting == 2)
    with pytest.raises(ProxyError) as refused:  # the queue is full
        await admission.acquire()
    assert refused.value.status == 429 and admission.waiting == 2

    admission.release()
    await asyncio.wait_for(first, GUARD_S)
    assert order == ["first"] and (admission.inflight, admission.waiting) == (1, 1)
    admission.release()
    await asyncio.wait_for(second, GUARD_S)
    assert order == ["first", "second"] and (admission.inflight, admission.waiting) == (1, 0)


@pytest.mark.parametrize("timeout_s", [0.0, 0.02])
async def test_a_waiter_that_times_out_gets_503_and_takes_no_slot(timeout_s):
    admission = Admission(max_inflight=1, max_queue=1, queue_timeout_s=timeout_s, retry_after_s=3)
    await admission.acquire()
    with pytest.raises(ProxyError) as timed_out:
        await admission.acquire()
    exc = timed_out.value
    assert (exc.status, exc.code, exc.headers) == (503, "overloaded", {"Retry-After": "3"})
    assert json.loads(Reply.error(exc, None).body)["error"]["type"] == "server_error"
    assert (admission.inflight, admission.waiting) == (1, 0)
    admission.release()
    await asyncio.wait_for(admission.acquire(), GUARD_S)  # the slot is free again, not lost
    assert admission.inflight == 1


async def test_release_gives_the_slot_back():
    admission = Admission(max_inflight=1, max_queue=0, queue_timeout_s=GUARD_S, retry_after_s=1)
    for _ in range(3):
        await admission.acquire()
        assert admission.inflight == 1
        admission.release()
        assert admission.inflight == 0


async def test_a_waiter_that_leaves_gives_up_its_place():
    """A client gone while queued (its task cancelled): it leaves the queue, and the next
    slot goes to the one behind it."""
    admission = Admission(max_inflight=1, max_queue=2, queue_timeout_s=GUARD_S, retry_after_s=1)
    await admission.acquire()
    order: list[str] = []
    leaving, staying = queue(admission, order, "leaving"), queue(admission, order, "staying")
    await settle(lambda: admission.waiting == 2)
    leaving.cancel()
    await asyncio.gather(leaving, return_exceptions=True)
    assert leaving.cancelled() and (admission.inflight, admission.waiting) == (1, 1)
    admission.release()
    await asyncio.wait_for(staying, GUARD_S)
    assert order == ["staying"] and (admission.inflight, admission.waiting) == (1, 0)


async def test_a_waiter_cancelled_as_its_slot_comes_free_loses_no_slot():
    """Cancelled between being handed the slot and running, the waiter either raises
    CancelledError holding nothing, or (Python 3.11's wait_for keeps a result that came
    first) is admitted and gives the slot back as every holder does: the app checks for
    that case itself (a client gone "just as a slot came free"). Either way the slot is
    neither lost nor doubled."""
    admission = Admission(max_inflight=1, max_queue=1, queue_timeout_s=GUARD_S, retry_after_s=1)
    await admission.acquire()
    admitted: list[str] = []

    async def leaving_waiter():
        await admission.acquire()
        admitted.append("leaving")
        admission.release()

    leaving = asyncio.create_task(leaving_waiter())
    await settle(lambda: admission.waiting == 1)
    admission.release()  # the slot is handed to the waiter...
    leaving.cancel()  # ...which is cancelled before it runs
    await asyncio.gather(leaving, return_exceptions=True)
    assert leaving.cancelled() or admitted == ["leaving"]
    assert (admission.inflight, admission.waiting) == (0, 0)
    await asyncio.wait_for(admission.acquire(), GUARD_S)  # not lost...
    behind = queue(admission, [], "behind")  # ...and not doubled: the next one waits
    await settle(lambda: admission.waiting == 1)
    assert not behind.done() and admission.inflight == 1
    behind.cancel()
    await asyncio.gather(behind, return_exceptions=True)


# In the app


@pytest.fixture
def behaviour():
    return StandinBehaviour()


@pytest.fixture
def worker_url(behaviour):
    with ThreadServer(create_standin(behaviour)) as worker:
        yield worker.url


@asynccontextmanager
async def proxy(worker_url: str, **settings):
    app = create_app(
        ProxySettings(
            prefill_urls=[worker_url],
            decode_urls=[worker_url],
            gc_interval_s=0,
            **merged({"admission": {"max_inflight": 1, "max_queue": 0}}, settings),
        )
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=GUARD_S) as client:
            yield app.state.admission, client


async def test_a_client_beyond_the_limit_gets_429_and_no_leg_is_sent(worker_url, behaviour):
    async with proxy(worker_url, admission={"retry_after_s": 2}) as (admission, client):
        await admission.acquire()  # the only slot
        response = await client.post("/v1/completions", json=BODY, headers={"X-Request-Id": "over"})
        admission.release()
        served = await client.post("/v1/completions", json=BODY)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2" and response.headers["x-request-id"] == "over"
    assert response.json()["error"] == {
        "message": "Too many requests in flight; retry later.",
        "type": "rate_limit_error",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert served.status_code == 200 and len(behaviour.received) == 2  # only the served one's legs


async def test_a_queued_client_that_times_out_gets_503(worker_url, behaviour):
    async with proxy(worker_url, admission={"max_queue": 1, "queue_timeout_s": 0.02, "retry_after_s": 4}) as (
        admission,
        client,
    ):
        await admission.acquire()
        response = await client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert admission.waiting == 0
        admission.release()
    assert response.status_code == 503 and response.headers["retry-after"] == "4"
    assert response.json()["error"]["code"] == "overloaded"
    assert response.json()["error"]["type"] == "server_error"
    assert behaviour.received == []


async def test_a_queued_client_is_served_when_the_slot_comes_free(worker_url):
    async with proxy(worker_url, admission={"max_queue": 1}) as (admission, client):
        await admission.acquire()
        queued = asyncio.create_task(client.post("/v1/completions", json=BODY))
        await settle(lambda: admission.waiting == 1)
        assert not queued.done()
        admission.release()
        response = await asyncio.wait_for(queued, GUARD_S)
        assert response.status_code == 200
        assert (admission.inflight, admission.waiting) == (0, 0)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_slot_is_given_back_after_a_served_request(worker_url, stream):
    async with proxy(worker_url) as (admission, client):
        for _ in range(3):  # one slot: each request needs the one before it to give it back
            response = await client.post("/v1/completions", json={**BODY, "stream": stream})
            assert response.status_code == 200 and admission.inflight == 0
        if stream:
            assert response.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize(
    "failure, broken, fixed",
    [("prefill_status", 500, 200), ("decode_status", 500, 200), ("break_stream_after", 2, None)],
)
async def test_the_slot_is_given_back_after_a_failed_request(worker_url, behaviour, failure, broken, fixed):
    setattr(behaviour, failure, broken)
    stream = failure == "break_stream_after"
    async with proxy(worker_url, retries={"prefill_failure_policy": "error", "decode_retries": 0}) as (
        admission,
        client,
    ):
        failed = await client.post("/v1/completions", json={**BODY, "stream": stream})
        assert admission.inflight == 0
        setattr(behaviour, failure, fixed)
        served = await client.post("/v1/completions", json={**BODY, "stream": stream})
    if stream:  # the stream began: it ends with an error event
        assert failed.status_code == 200 and '"error"' in failed.text
    else:
        assert failed.status_code == 502
    assert served.status_code == 200 and '"error"' not in served.text


async def test_requests_refused_before_admission_take_no_slot(worker_url):
    """Validation comes first: with the only slot held, a bad request is still a 400,
    not a 429, and it never counts as in flight."""
    async with proxy(worker_url) as (admission, client):
        await admission.acquire()
        response = await client.post("/v1/completions", content=b"{", headers={"content-type": "application/json"})
        assert response.status_code == 400 and admission.inflight == 1
        admission.release()
