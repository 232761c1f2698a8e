"""One disaggregated request: prefill leg, KV hand-off, decode leg, relay to the client."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from starlette.responses import Response, StreamingResponse

from proxy.errors import ProxyError, sse_error_event
from proxy.legs import decode_body, prefill_body
from proxy.metrics import ProxyMetrics
from proxy.pool import Worker, WorkerPool

log = logging.getLogger("pdspec.proxy")

_PASSTHROUGH_HEADERS = ("content-type",)


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


@dataclass
class Disaggregator:
    session: aiohttp.ClientSession
    prefill_pool: WorkerPool
    decode_pool: WorkerPool
    metrics: ProxyMetrics
    prefill_timeout: aiohttp.ClientTimeout
    decode_timeout: aiohttp.ClientTimeout

    async def serve(self, path: str, body: dict[str, Any], chat: bool, request_id: str) -> Response:
        headers = {"X-Request-Id": request_id}
        try:
            kv_transfer_params = await self._prefill(path, body, chat, request_id)
            return await self._decode(path, body, kv_transfer_params, request_id)
        except PassThrough as passthrough:
            reply = passthrough.reply
            return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=headers)

    async def _prefill(self, path: str, body: dict[str, Any], chat: bool, request_id: str) -> dict[str, Any]:
        worker = self.prefill_pool.pick()
        started = time.perf_counter()
        reply = await self._post_json(worker, path, prefill_body(body, chat), request_id, self.prefill_timeout, "prefill")
        self.metrics.leg_seconds.labels("prefill").observe(time.perf_counter() - started)
        params = reply.get("kv_transfer_params")
        if not isinstance(params, dict):
            # Without it the decode worker would silently recompute the prompt.
            self.metrics.leg_failures.labels("prefill", "no_kv_transfer_params").inc()
            raise ProxyError(502, "Prefill worker returned no kv_transfer_params; is it a NixlConnector kv_producer?")
        return params

    async def _post_json(
        self, worker: Worker, path: str, body: dict, request_id: str, timeout: aiohttp.ClientTimeout, leg: str
    ) -> dict[str, Any]:
        worker.outstanding += 1
        try:
            async with self.session.post(
                worker.url + path, json=body, headers={"X-Request-Id": request_id}, timeout=timeout
            ) as resp:
                data = await resp.read()
                if resp.status != 200:
                    raise self._worker_error(leg, resp.status, data, resp.headers.get("content-type", ""))
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.metrics.leg_failures.labels(leg, type(exc).__name__).inc()
            raise ProxyError(502 if not isinstance(exc, asyncio.TimeoutError) else 504,
                             f"{leg} worker {worker.url} failed: {type(exc).__name__}") from exc
        finally:
            worker.outstanding -= 1

    def _worker_error(self, leg: str, status: int, data: bytes, content_type: str) -> Exception:
        if 400 <= status < 500:
            self.metrics.leg_failures.labels(leg, f"http_{status}").inc()
            return PassThrough(WorkerReply(status, data, content_type or "application/json"))
        self.metrics.leg_failures.labels(leg, f"http_{status}").inc()
        return ProxyError(502, f"{leg} worker answered HTTP {status}: {data[:200].decode('utf-8', 'replace')}")

    async def _decode(self, path: str, body: dict[str, Any], kv: dict[str, Any], request_id: str) -> Response:
        worker = self.decode_pool.pick()
        headers = {"X-Request-Id": request_id}
        started = time.perf_counter()
        worker.outstanding += 1
        try:
            resp = await self.session.post(
                worker.url + path, json=decode_body(body, kv), headers=headers, timeout=self.decode_timeout
            )
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            worker.outstanding -= 1
            self.metrics.leg_failures.labels("decode", type(exc).__name__).inc()
            raise ProxyError(502, f"decode worker {worker.url} failed: {type(exc).__name__}") from exc

        # Check the status before any byte goes to the client: once a streaming
        # response has started, its status can no longer change.
        if resp.status != 200:
            try:
                data = await resp.read()
            finally:
                resp.release()
                worker.outstanding -= 1
            raise self._worker_error("decode", resp.status, data, resp.headers.get("content-type", ""))

        if body.get("stream"):
            return StreamingResponse(
                self._relay(resp, worker, started), media_type="text/event-stream", headers=headers
            )
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
