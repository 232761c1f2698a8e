"""One disaggregated request: prefill leg, KV hand-off, decode leg, relay to the client.

Failure handling, in order of the request's life:
- prefill leg: a worker's 4xx goes back to the client as is (its fault, no retry);
  a 5xx, connection error or timeout follows `prefill_failure_policy`: `error` returns
  it, `retry` tries other prefill workers (bounded, with backoff), `fallback` sends the
  request to a decode worker without KV params, which then prefills it itself;
- hand-off: the prefill worker's `kv_transfer_params` must name a host of the prefill
  pool, so no reply can steer a decode worker to pull KV from anywhere else;
- decode leg: retried on another decode worker only before its first byte reached the
  client; afterwards a broken stream ends with an SSE error event, never a hang.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from starlette.responses import Response, StreamingResponse

from pdspec.settings import ProxySettings
from proxy.errors import ProxyError, sse_error_event
from proxy.legs import decode_body, prefill_body
from proxy.metrics import ProxyMetrics
from proxy.pool import NoHealthyWorker, Worker, WorkerPool, affinity_key

log = logging.getLogger("pdspec.proxy")


@dataclass
class WorkerReply:
    """A worker answered with a status the client should see as is (a 4xx)."""

    status: int
    body: bytes
    content_type: str


class PassThrough(Exception):
    def __init__(self, reply: WorkerReply):
        super().__init__(f"worker replied {reply.status}")
        self.reply = reply


class LegFailed(Exception):
    """A leg failed in a way another worker might not (5xx, connection, timeout)."""

    def __init__(self, status: int, message: str, reason: str):
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


@dataclass
class Disaggregator:
    session: aiohttp.ClientSession
    prefill_pool: WorkerPool
    decode_pool: WorkerPool
    metrics: ProxyMetrics
    settings: ProxySettings

    def __post_init__(self) -> None:
        s = self.settings
        self.prefill_timeout = aiohttp.ClientTimeout(total=s.prefill_timeout_s, connect=s.connect_timeout_s)
        self.decode_timeout = aiohttp.ClientTimeout(total=s.decode_timeout_s, connect=s.connect_timeout_s)
        self.worker_headers = {"Authorization": f"Bearer {s.worker_api_key}"} if s.worker_api_key else {}

    async def serve(self, path: str, body: dict[str, Any], chat: bool, request_id: str) -> Response:
        try:
            kv_transfer_params = await self._prefill(path, body, chat, request_id)
            return await self._decode(path, body, kv_transfer_params, request_id)
        except PassThrough as passthrough:
            reply = passthrough.reply
            return Response(
                reply.body, status_code=reply.status, media_type=reply.content_type, headers={"X-Request-Id": request_id}
            )

    # --- prefill ---------------------------------------------------------------------

    async def _prefill(self, path: str, body: dict, chat: bool, request_id: str) -> dict[str, Any] | None:
        policy = self.settings.prefill_failure_policy
        attempts = 1 + (self.settings.prefill_retries if policy == "retry" else 0)
        tried: set[str] = set()
        key = affinity_key(body)
        failure: LegFailed | None = None
        for attempt in range(attempts):
            try:
                worker = self.prefill_pool.pick(affinity_key=key, exclude=tried)
            except NoHealthyWorker:
                failure = failure or LegFailed(503, "no healthy prefill worker", "no_healthy_worker")
                break
            tried.add(worker.url)
            try:
                params = await self._prefill_once(worker, path, body, chat, request_id)
            except LegFailed as exc:
                failure = exc
                self.metrics.leg_failures.labels("prefill", exc.reason).inc()
                if attempt + 1 < attempts:
                    await asyncio.sleep(self.settings.retry_backoff_s * (2**attempt))
                continue
            self.metrics.prefill_outcomes.labels("ok" if attempt == 0 else "retried_ok").inc()
            return params
        assert failure is not None
        if policy == "fallback":
            # The decode worker prefills the prompt itself: slower, but the request lives.
            self.metrics.prefill_outcomes.labels("fallback").inc()
            log.warning("request %s: prefill failed (%s); decode-only fallback", request_id, failure.message)
            return None
        self.metrics.prefill_outcomes.labels("error").inc()
        raise ProxyError(failure.status, failure.message)

    async def _prefill_once(self, worker: Worker, path: str, body: dict, chat: bool, request_id: str) -> dict:
        started = time.perf_counter()
        worker.outstanding += 1
        try:
            async with self.session.post(
                worker.url + path,
                json=prefill_body(body, chat),
                headers={"X-Request-Id": request_id, **self.worker_headers},
                timeout=self.prefill_timeout,
            ) as resp:
                data = await resp.read()
                if resp.status != 200:
                    raise self._worker_error("prefill", worker, resp.status, data, resp.headers.get("content-type"))
                reply = await resp.json(content_type=None)
        except asyncio.TimeoutError:
            raise LegFailed(504, f"prefill worker {worker.url} timed out", "timeout") from None
        except aiohttp.ClientError as exc:
            raise LegFailed(502, f"prefill worker {worker.url} failed: {type(exc).__name__}", type(exc).__name__) from None
        finally:
            worker.outstanding -= 1
        self.metrics.leg_seconds.labels("prefill").observe(time.perf_counter() - started)
        params = reply.get("kv_transfer_params")
        if not isinstance(params, dict):
            # Without it the decode worker would silently recompute the prompt.
            raise LegFailed(502, "Prefill worker returned no kv_transfer_params; is it a kv_producer?", "no_kv_params")
        self._check_remote(params)
        return params

    def _check_remote(self, params: dict) -> None:
        host = params.get("remote_host")
        allowed = {w.host for w in self.prefill_pool.workers} | set(self.settings.kv_source_hosts)
        if host is not None and host not in allowed:
            raise LegFailed(502, f"prefill worker named a KV source outside its pool: {host}", "foreign_remote_host")

    def _worker_error(self, leg: str, worker: Worker, status: int, data: bytes, content_type: str | None):
        if 400 <= status < 500:
            self.metrics.leg_failures.labels(leg, f"http_{status}").inc()
            return PassThrough(WorkerReply(status, data, content_type or "application/json"))
        text = data[:200].decode("utf-8", "replace")
        return LegFailed(502, f"{leg} worker {worker.url} answered HTTP {status}: {text}", f"http_{status}")

    # --- decode ----------------------------------------------------------------------

    async def _decode(self, path: str, body: dict, kv: dict | None, request_id: str) -> Response:
        headers = {"X-Request-Id": request_id}
        tried: set[str] = set()
        failure: LegFailed | None = None
        for attempt in range(1 + self.settings.decode_retries):
            try:
                worker = self.decode_pool.pick(exclude=tried)
            except NoHealthyWorker:
                failure = failure or LegFailed(503, "no healthy decode worker", "no_healthy_worker")
                break
            tried.add(worker.url)
            started = time.perf_counter()
            try:
                resp = await self._open_decode(worker, path, body, kv, request_id)
            except LegFailed as exc:
                failure = exc
                self.metrics.leg_failures.labels("decode", exc.reason).inc()
                if attempt < self.settings.decode_retries:  # no pause before giving up
                    await asyncio.sleep(self.settings.retry_backoff_s * (2**attempt))
                continue
            if body.get("stream"):
                return StreamingResponse(self._relay(resp, worker, started), media_type="text/event-stream",
                                         headers=headers)  # fmt: skip
            try:
                data = await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.metrics.leg_failures.labels("decode", type(exc).__name__).inc()
                raise ProxyError(502, f"decode worker {worker.url} failed mid-response: {type(exc).__name__}") from exc
            finally:
                resp.release()
                worker.outstanding -= 1
            self.metrics.leg_seconds.labels("decode").observe(time.perf_counter() - started)
            return Response(data, status_code=200, media_type="application/json", headers=headers)
        assert failure is not None
        raise ProxyError(failure.status, failure.message)

    async def _open_decode(self, worker: Worker, path: str, body: dict, kv: dict | None, request_id: str):
        """The decode response, checked before any byte goes to the client: once a
        streaming response has started, its status can no longer change."""
        worker.outstanding += 1
        try:
            resp = await self.session.post(
                worker.url + path,
                json=decode_body(body, kv),
                headers={"X-Request-Id": request_id, **self.worker_headers},
                timeout=self.decode_timeout,
            )
        except asyncio.TimeoutError:
            worker.outstanding -= 1
            raise LegFailed(504, f"decode worker {worker.url} timed out", "timeout") from None
        except aiohttp.ClientError as exc:
            worker.outstanding -= 1
            raise LegFailed(502, f"decode worker {worker.url} failed: {type(exc).__name__}", type(exc).__name__) from None
        if resp.status != 200:
            try:
                data = await resp.read()
            finally:
                resp.release()
                worker.outstanding -= 1
            raise self._worker_error("decode", worker, resp.status, data, resp.headers.get("content-type"))
        return resp

    async def _relay(self, resp: aiohttp.ClientResponse, worker: Worker, started: float) -> AsyncIterator[bytes]:
        finished = False
        try:
            async for chunk in resp.content.iter_any():
                yield chunk
            finished = True
            self.metrics.leg_seconds.labels("decode").observe(time.perf_counter() - started)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # Headers are gone already: end the stream with an error event, not a hang.
            self.metrics.stream_errors.inc()
            self.metrics.leg_failures.labels("decode", type(exc).__name__).inc()
            log.warning("decode stream from %s broke: %r", worker.url, exc)
            yield sse_error_event(502, f"decode worker failed mid-stream: {type(exc).__name__}")
        finally:
            if finished:
                resp.release()  # keep the connection for the next request
            else:
                # Dropping the connection makes vLLM abort the request (client gone).
                resp.close()
            worker.outstanding -= 1
