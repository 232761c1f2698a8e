"""A decode worker's reply on its way to the client (proxy/flow/disagg.py opens it).

Contract: `read()` returns a whole reply, `chunks()` relays a stream as it comes; either
marks the hand-off done at the first byte that follows the KV read (the prefill reply to
that byte is `pdspec_proxy_leg_seconds{leg="handoff"}`), and a prompt the worker prefilled
itself done there (its lease's `prefilled()`). Failure policy: a reply that
breaks before it is whole is a 502 (`read`), or, its headers being gone already, a stream
that ends with an SSE error event, never a hang (`chunks`). `close()` is idempotent and
safe at any point; a reply not read to its end drops its connection, so vLLM aborts it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from proxy.errors import ProxyError, sse_error_event
from proxy.fleet.pool import Lease, Worker
from proxy.metrics import ProxyMetrics
from proxy.tracing import NoTrace
from proxy.upstream.client import UpstreamError, UpstreamResponse

log = logging.getLogger("pdspec.proxy")


@dataclass(frozen=True, slots=True)
class RelayMetrics:
    """What a relay counts, handed in by its maker; the children every request touches are
    bound once (labels() costs a lock)."""

    handoff_seconds: Any  # pdspec_proxy_leg_seconds{leg="handoff"}
    decode_seconds: Any  # pdspec_proxy_leg_seconds{leg="decode"}
    stream_errors: Any  # pdspec_proxy_stream_errors_total
    leg_failures: Any  # pdspec_proxy_leg_failures_total, labelled by leg and reason

    @classmethod
    def of(cls, metrics: ProxyMetrics) -> RelayMetrics:
        return cls(
            metrics.leg_seconds.labels("handoff"),
            metrics.leg_seconds.labels("decode"),
            metrics.stream_errors,
            metrics.leg_failures,
        )


class Relay:
    """The decode worker's body on its way to the client. Owns the worker's lease (its
    in-flight count) and the connection: `close()` is safe at any point, also before the first
    chunk, and a stream that did not finish drops its connection so vLLM aborts."""

    __slots__ = (
        "metrics",
        "resp",
        "worker",
        "lease",
        "trace",
        "span",
        "handoff",
        "handoff_started",
        "started",
        "closed",
        "preamble_events",
        "preamble",
        "error_event",
    )

    def __init__(
        self,
        metrics: RelayMetrics,
        resp: UpstreamResponse,
        worker: Worker,
        lease: Lease,
        trace: NoTrace,
        span,
        handoff,
        handoff_started: float | None = None,
    ):
        self.metrics = metrics
        self.resp = resp
        self.worker = worker
        self.lease = lease
        self.trace = trace
        self.span = span
        self.handoff = handoff
        self.handoff_started = handoff_started
        self.started = time.perf_counter()
        self.closed = False
        # Events the decode worker sends before it has read the KV (the Responses API's
        # two; chat's first event comes after the engine's first output): the hand-off is
        # done only when the event after them begins.
        self.preamble_events = 0
        self.preamble = b""  # what came of them so far
        self.error_event = sse_error_event  # (status, message) -> the event ending a broken stream

    def _first_byte(self) -> None:
        # The worker has the prompt's first token: a prompt it prefilled itself is no longer
        # ahead of the next (conditional disaggregation's decode-side queue).
        self.lease.prefilled()
        if self.handoff_started is not None:
            # Prefill reply to the decode worker's first byte: the NIXL pull and first step.
            self.metrics.handoff_seconds.observe(time.perf_counter() - self.handoff_started)
            self.handoff_started = None
        if self.handoff is not None:
            self.trace.end(self.handoff)
            self.handoff = None

    async def read(self) -> bytes:
        try:
            data = await self.resp.read()
        except UpstreamError as exc:
            self.metrics.leg_failures.labels("decode", exc.reason).inc()
            self.close(error=exc.reason)
            raise ProxyError(502, f"decode worker {self.worker.url} failed mid-response: {exc.reason}") from None
        except BaseException:  # cancelled: the client went away
            self.close(error="cancelled")
            raise
        self._first_byte()
        self.close()
        return data

    def _past_preamble(self, chunk: bytes) -> bool:
        self.preamble += chunk
        at = 0
        for _ in range(self.preamble_events):
            at = self.preamble.find(b"\n\n", at)
            if at == -1:
                return False
            at += 2
        if len(self.preamble) == at:  # the next event has not begun
            return False
        self.preamble_events, self.preamble = 0, b""
        return True

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.resp.iter_chunks():
                if not self.preamble_events or self._past_preamble(chunk):
                    self._first_byte()
                yield chunk
        except UpstreamError as exc:
            if self.closed:  # the proxy dropped the stream itself: its client is gone
                return
            # Headers are gone already: end the stream with an error event, not a hang.
            self.metrics.stream_errors.inc()
            self.metrics.leg_failures.labels("decode", exc.reason).inc()
            log.warning("decode stream from %s broke: %s", self.worker.url, exc.reason)
            self.close(error=exc.reason)
            yield self.error_event(502, f"decode worker failed mid-stream: {exc.reason}")
        finally:
            self.close()

    def close(self, error: str | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        if self.resp.complete and error is None:
            self.resp.release()  # keep the connection for the next request
            self.metrics.decode_seconds.observe(time.perf_counter() - self.started)
        else:
            self.resp.close()  # dropping the connection makes vLLM abort the request
            error = error or "client gone"
        self.lease.release()
        self.trace.end(self.handoff, error)
        self.handoff = None
        self.trace.end(self.span, error)
