"""proxy/edge/connections.py: client connection limits, on the real proxy app under uvicorn
(stand-in workers behind it), with raw sockets playing the clients."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from pdspec.settings import ProxySettings
from proxy.app import create_app
from proxy.edge.connections import ClientLimits, limited_protocol
from tests.standin import StandinBehaviour, ThreadServer, create_standin

LIMITS = ClientLimits(
    max_header_bytes=16 * 1024, head_timeout_s=1.0, body_timeout_s=1.0, idle_timeout_s=1.0, max_connections=8
)
BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}


@pytest.fixture
def proxy():
    with ThreadServer(create_standin(StandinBehaviour())) as worker:
        settings = ProxySettings(prefill_urls=[worker.url], decode_urls=[worker.url], health={"interval_s": 0.2})
        app = create_app(settings)
        refusals = app.state.metrics.client_refusals
        protocol = limited_protocol(LIMITS, lambda reason: refusals.labels(reason).inc())
        with ThreadServer(app, http=protocol, timeout_keep_alive=LIMITS.idle_timeout_s) as server:
            yield server


def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def read_reply(sock: socket.socket) -> tuple[int, dict]:
    """Status and JSON body of the one reply the proxy sends before closing."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def refusals(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("pdspec_proxy_client_refusals_total{"):
            out[line.split('"')[1]] = float(line.split()[-1])
    return out


def assert_served(server) -> None:
    response = httpx.post(server.url + "/v1/completions", json=BODY, timeout=10)
    assert response.status_code == 200


def served_again(server, within_s: float = 5) -> None:
    """Served within `within_s`: the proxy notices closed sockets on its own loop."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            assert_served(server)
            return
        except (AssertionError, httpx.TransportError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # poll interval


def test_a_head_that_never_ends_is_refused_and_cut_off_without_reading_it_all(proxy):
    """8 MiB offered: the proxy refuses at the limit, drops at most REFUSAL_LINGER_BYTES
    more, then cuts the connection (the client's send fails long before 8 MiB)."""
    sock = connect(proxy)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: ")
    sent = 0
    try:
        while sent < 8 * 1024 * 1024:
            sock.sendall(b"a" * 65536)
            sent += 65536
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < 8 * 1024 * 1024
    assert refusals(proxy)["header_too_large"] == 1
    assert_served(proxy)


def test_refused_clients_still_draining_do_not_hold_the_connection_slots(proxy):
    """As many clients answered 503 as there are slots, keeping their sockets open (the
    proxy drains them for REFUSAL_LINGER_S, 2 s), take no slot: once the held connections
    close, a good client is served well within the drain (counted as slots, they refused it
    until the drain ended)."""
    held = [connect(proxy) for _ in range(LIMITS.max_connections)]
    refused = [connect(proxy) for _ in range(LIMITS.max_connections)]
    for sock in refused:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_reply_head(sock) == 503
    for sock in held:
        sock.close()
    served_again(proxy, within_s=1.0)
    for sock in refused:
        sock.close()


def read_reply_head(sock: socket.socket) -> int:
    """The status of the reply, read up to its head's end, the socket left open."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before a reply"
        data += chunk
    return int(data.split(b" ")[1])


@pytest.mark.parametrize("status, reason", [(431, "header_too_large"), (503, "too_many_connections")])
def test_a_refused_client_still_sending_reads_its_error_not_a_reset(proxy, status, reason):
    """Closed at once with the client's bytes unread, a socket is reset, and the reset can
    destroy the reply before the client reads it (`Connection reset by peer`, seen in one
    run in three on two busy cores): the proxy half-closes and drains instead. 20 clients
    each send 200 KB of head (431) or, with the connections full, a request (503) and
    only then read."""
    held = [connect(proxy) for _ in range(LIMITS.max_connections)] if status == 503 else []
    payload = json.dumps(BODY).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
    if status == 431:
        head += b"X-Big: " + b"a" * 200 * 1024 + b"\r\n"
    request = head + b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
    for _ in range(20):
        sock = connect(proxy)
        sock.sendall(request)
        assert read_reply(sock)[0] == status
        sock.close()
    for sock in held:
        sock.close()
    served_again(proxy)
    assert refusals(proxy)[reason] == 20


def test_a_head_sent_a_byte_at_a_time_times_out_with_408(proxy):
    sock = connect(proxy)
    started = time.monotonic()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\n")
    try:
        for _ in range(100):
            sock.sendall(b"X")
            time.sleep(0.1)  # the slow client itself, not a wait for readiness
    except (BrokenPipeError, ConnectionResetError):
        pass
    status, body = read_reply(sock)
    assert status == 408 and "head" in body["error"]["message"]
    assert time.monotonic() - started < 5
    assert refusals(proxy)["head_timeout"] == 1


def test_a_body_never_finished_times_out_with_408(proxy):
    sock = connect(proxy)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b'content-length: 1000\r\n\r\n{"model": '
    )
    status, body = read_reply(sock)
    assert status == 408 and "body" in body["error"]["message"]
    assert refusals(proxy)["body_timeout"] == 1
    assert_served(proxy)


def test_an_idle_connection_is_closed(proxy):
    silent = connect(proxy)
    assert closed_within(silent, 5)
    kept_alive = connect(proxy)
    assert serve_one(kept_alive).startswith(b"HTTP/1.1 200")
    assert closed_within(kept_alive, 5)


def serve_one(sock: socket.socket) -> bytes:
    """Send a completion on a kept-alive connection and read its whole reply (by its
    content-length, the socket left open); its head."""
    payload = json.dumps(BODY).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(65536)
    head, _, body = reply.partition(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_connections_beyond_the_cap_are_503_and_the_others_still_served(proxy):
    held = [connect(proxy) for _ in range(LIMITS.max_connections)]
    extra = connect(proxy)
    status, body = read_reply(extra)
    assert status == 503 and "connections" in body["error"]["message"]
    for sock in held:
        sock.close()
    served_again(proxy)


def test_a_healthy_request_within_the_limits_is_untouched(proxy):
    headers = {"X-Fine": "a" * 8 * 1024}
    response = httpx.post(proxy.url + "/v1/completions", json=BODY, headers=headers, timeout=10)
    assert response.status_code == 200
    assert sum(refusals(proxy).values()) == 0


@pytest.mark.parametrize("kilobytes", [17, 70])
def test_a_head_over_the_limit_that_arrives_whole_is_431(proxy, kilobytes):
    """One write of the whole head: the proxy once counted a head per chunk after parsing
    it, so a head that came in one chunk was never refused (70 KB against 64 KiB: 200)."""
    payload = json.dumps(BODY).encode()
    sock = connect(proxy)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nX-Big: "
        + b"a" * (kilobytes * 1024)
        + b"\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    status, body = read_reply(sock)
    assert status == 431 and body["error"]["type"]
    assert refusals(proxy)["header_too_large"] == 1
    assert_served(proxy)


def test_a_big_body_after_a_head_within_the_limit_is_not_counted_as_head(proxy):
    """The body's bytes in the head's last chunk, and a head whose blank line straddles two
    chunks, are not the head's."""
    prompt = "hello " * 8000  # 48 KB of body, more than the 16 KiB head limit
    payload = json.dumps({**BODY, "prompt": prompt}).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(payload)
    )
    sock = connect(proxy)
    sock.sendall(head[:-2])
    time.sleep(0.2)  # a chunk boundary inside the blank line (the client's own pace)
    sock.sendall(head[-2:] + payload)
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert sum(refusals(proxy).values()) == 0


@pytest.mark.parametrize(
    "tail, data, expected",
    [
        (b"", b"GET / HTTP/1.1\r\n\r\nbody", 18),
        (b"", b"partial", 7),
        (b"\r\n\r", b"\nbody", 1),
        (b"x\r\n", b"\r\nbody", 2),
        (b"", b"\r\n\r\n", 4),
    ],
)
def test_head_part_counts_up_to_the_blank_line(tail, data, expected):
    from proxy.edge.connections import head_part

    assert head_part(tail, data) == expected


def test_each_request_is_told_its_connection():
    """The protocol puts the connection in the scope's extensions (proxy/asgi.py), the same
    object for every request of a kept-alive connection, another for another connection."""
    from proxy.asgi import CONNECTION_EXTENSION

    seen = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        seen.append(scope.get("extensions", {}).get(CONNECTION_EXTENSION))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    with ThreadServer(app, http=limited_protocol(LIMITS)) as server:
        with httpx.Client() as client:
            client.get(server.url + "/a")
            client.get(server.url + "/b")
        httpx.get(server.url + "/c")
    assert seen[0] is not None and seen[0] is seen[1] and seen[2] is not seen[0]


class RecordingTransport:
    def __init__(self):
        self.writes, self.closed, self.aborted, self.eof = [], False, False, False
        self.after_eof = []

    def write(self, data):
        assert not self.closed, "written after close"
        # asyncio's and uvloop's raise here; from a flush callback the loop would only log it
        (self.after_eof if self.eof else self.writes).append(data)

    def write_eof(self):
        self.eof = True

    def close(self):
        self.closed = True

    def abort(self):
        self.aborted = self.closed = True

    def is_closing(self):
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


def test_writes_of_one_step_leave_as_one_and_in_order():
    from proxy.edge.connections import CoalescingTransport

    async def main():
        inner = RecordingTransport()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"")
        transport.write(b"body")
        assert inner.writes == []  # held until the step ends
        await asyncio.sleep(0)
        transport.write(b"next")
        await asyncio.sleep(0)
        return inner.writes

    assert asyncio.run(main()) == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"next"]


def test_close_writes_what_is_held_and_abort_drops_it():
    from proxy.edge.connections import CoalescingTransport

    async def main():
        loop = asyncio.get_running_loop()
        closing, aborting = RecordingTransport(), RecordingTransport()
        first, second = CoalescingTransport(closing, loop), CoalescingTransport(aborting, loop)
        first.write(b"refusal")
        first.close()
        second.write(b"lost")
        second.abort()
        await asyncio.sleep(0)  # the scheduled flushes find nothing, or a closed transport
        return closing, aborting, first.get_extra_info("peername"), first.is_closing()

    closing, aborting, peer, is_closing = asyncio.run(main())
    assert (closing.writes, closing.closed) == ([b"refusal"], True)
    assert (aborting.writes, aborting.aborted) == ([], True)
    assert peer == ("127.0.0.1", 1) and is_closing


def test_write_eof_sends_what_is_held_first_and_drops_later_writes():
    """A refusal's reply, then the FIN; a pipelined request's reply written after it (its
    flush comes a step later) is dropped, not raised from the event loop's callback."""
    from proxy.edge.connections import CoalescingTransport

    async def main():
        inner = RecordingTransport()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"earlier reply, held")
        transport.write(b"refusal")
        transport.write_eof()
        transport.write(b"a later reply")
        await asyncio.sleep(0)
        return inner

    inner = asyncio.run(main())
    assert inner.writes == [b"earlier reply, heldrefusal"] and inner.eof and inner.after_eof == []


def test_a_whole_reply_leaves_in_one_write():
    """uvicorn writes a reply's head and body one after the other; the socket sees one write."""
    writes = []

    class CountingTransport:
        def __init__(self, transport):
            self.transport = transport

        def write(self, data):
            writes.append(data)
            self.transport.write(data)

        def __getattr__(self, name):
            return getattr(self.transport, name)

    class Counted(limited_protocol(LIMITS)):
        def connection_made(self, transport):
            super().connection_made(CountingTransport(transport))

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello"})

    with ThreadServer(app, http=Counted) as server:
        assert httpx.get(server.url + "/").text == "hello"
    assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200") and writes[0].endswith(b"hello")


def test_a_refusal_on_a_kept_alive_connection_drains_past_the_keep_alive_timeout(proxy):
    """After a served request uvicorn arms its keep-alive timer (1 s here); a head over the
    limit that arrives in one read is refused before uvicorn sees the bytes, so that timer
    would still close the socket 1 s after the reply, mid-drain, and what the client still
    sends would be answered with a reset. The refusal unsets it: 1.4 s after the 431 the
    proxy still drops what comes (REFUSAL_LINGER_S is 2 s), then closes."""
    sock = connect(proxy)
    assert serve_one(sock).startswith(b"HTTP/1.1 200")
    # The whole head in one send of 32 KB, twice the limit: refused in the read that brings it.
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 32 * 1024 + b"\r\n")
    assert read_reply_head(sock) == 431
    # The keep-alive timer was armed at the 200, before the 431: 1.2 s after the 431 is past
    # it, and 0.8 s before the drain's end (2 s after the 431 was written).
    time.sleep(1.2)
    sock.sendall(b"b" * 4096)
    time.sleep(0.2)  # a reset, had the socket been closed, is back by now on loopback
    sock.sendall(b"b" * 4096)  # raises ConnectionResetError / BrokenPipeError after a reset
    sock.close()
    served_again(proxy)


def test_a_pipelined_request_refused_while_reading_is_paused_is_drained_not_reset():
    """uvicorn pauses reading when a request arrives pipelined behind one still in flight; a
    refusal then (here the pipelined request's body timeout) must resume reading, or the
    client's body stays unread: its send blocks once the socket buffers are full, and the
    close at the linger's end resets the connection, the 408 never read. A first request
    still in flight, a second whose 900-KB body (under REFUSAL_LINGER_BYTES, past what a
    16-KB send buffer and the proxy's unread receive buffer hold) is sent one byte short: the
    client finishes sending, closes its half, and reads the 408 and a clean end. (The 408 is
    the first reply on the connection, ahead of the first request's: `_refuse` ends the
    connection, and a pipelining client learns of it that way.) Its power to fail rests on
    the proxy's receive buffer staying under the body (Linux grows it only as it is read)."""
    entered, done = threading.Event(), threading.Event()

    async def slow_app(scope, receive, send):
        if scope["type"] != "http":
            return
        entered.set()
        while not done.is_set():  # in flight until the test is done: nothing else resumes reading
            await asyncio.sleep(0.05)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    protocol = limited_protocol(LIMITS)
    with ThreadServer(slow_app, http=protocol, timeout_keep_alive=LIMITS.idle_timeout_s) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", server.port))
        data = b""
        try:
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            assert entered.wait(5)
            body = b"b" * 900 * 1024
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-length: %d\r\n\r\n" % (len(body) + 1))
            sock.sendall(body)  # BrokenPipeError (or a reset) here had the proxy stopped reading
            sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(65536):
                data += chunk
        finally:
            done.set()
            sock.close()
    assert data.startswith(b"HTTP/1.1 408")
