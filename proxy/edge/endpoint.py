"""The generation endpoints (proxy/apis/registry.py: completions, chat, responses, messages)
as plain ASGI, one `OpenAIEndpoint` per API: the hot path, served ahead of FastAPI's
middleware and routing (proxy/app.py), since FastAPI's per-request machinery cost more
than both worker legs together (profiled under loadtest/micro/proxy_bench.py).

A request is read under the body limit, checked as vLLM would check it (its API's
validation, the bound on choices, the model's context), admitted (a slot or a place in
the queue), and handed to the Disaggregator as an Exchange. Failure policy: every error
the proxy answers is in its API's error shape (`Api.error_body`) with the request id; a
client that leaves while queued gives up its place (no prefill is sent) and one that
leaves later cancels its legs (499, nothing sent); one the proxy's shutdown cancels counts
as 503, not as a bug; an unexpected exception is logged and answered 500 (unless the reply
began), and the proxy lives on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import time

from pdspec.settings import ClientSettings
from proxy.admission.queue import Admission
from proxy.apis.api import Api
from proxy.apis.limits import ModelLimits
from proxy.apis.validation import check_content_type, parse_json_object
from proxy.asgi import CONNECTION_EXTENSION, DisconnectWatch, Reply, header, read_body, send_reply
from proxy.auth import ApiKeys
from proxy.errors import ProxyError
from proxy.flow.disagg import Disaggregator
from proxy.flow.exchange import Exchange
from proxy.flow.fanout import choice_count, prompts_of
from proxy.metrics import ProxyMetrics
from proxy.tracing import NO_TRACE, Tracing

log = logging.getLogger("pdspec.proxy")


class OpenAIEndpoint:
    """POST one of proxy/apis/registry.py's APIs (/v1/completions, /v1/chat/completions,
    /v1/responses, /v1/messages), as plain ASGI."""

    def __init__(
        self,
        api: Api,
        clients: ClientSettings,
        api_keys: ApiKeys,
        admission: Admission,
        limits: ModelLimits,
        disaggregator: Disaggregator,
        metrics: ProxyMetrics,
        tracing: Tracing,
        access_log: bool = False,
    ) -> None:
        """`clients`: the request limits (max_body_bytes, max_choices); `access_log`: log
        every request, not only failed ones (the `observability` group's)."""
        self.api = api
        self.path = api.path
        self.endpoint = api.name
        self.clients = clients
        self.access_log = access_log
        self.api_keys = api_keys
        self.admission = admission
        self.limits = limits
        self.disaggregator = disaggregator
        self.metrics = metrics
        self.tracing = tracing
        # The 500 series (the proxy's own "Internal proxy error", alert PdspecProxyInternalError)
        # exported at 0 from the start: born at 1, `increase` would never see its first one.
        self._requests_by_status: dict[int, object] = {500: metrics.requests.labels(self.endpoint, "500")}

    async def __call__(self, scope, receive, send) -> None:
        started = time.perf_counter()
        request_id = request_id_of(scope)
        status = 500
        trace = NO_TRACE
        try:
            if scope["method"] != "POST":
                raise ProxyError(405, f"Method {scope['method']} is not allowed; use POST.")
            self.api_keys.check(header(scope, b"authorization"))
            check_content_type(header(scope, b"content-type"))
            body = parse_json_object(await read_body(scope, receive, self.clients.max_body_bytes))
            self.api.validate(body)
            if self.api.fans_out:
                check_choices(body, self.clients.max_choices)
            if self.api.limit_fields:
                await self.limits.check(body, self.api.limit_fields)
            if self.api.prepare is not None:
                self.api.prepare(body, request_id)
            # Watched from here on: a client that leaves while queued gives up its place
            # (no prefill is sent), and one that leaves later cancels its legs.
            watch = DisconnectWatch(receive, send, scope.get("extensions", {}).get(CONNECTION_EXTENSION))
            try:
                await self.admission.acquire()
                try:
                    if watch.disconnected:  # left just as a slot came free
                        raise asyncio.CancelledError
                    self.metrics.inflight.set(self.admission.inflight)
                    trace = self.tracing.begin(request_id, self.endpoint, header(scope, b"traceparent"))
                    status = await self._serve(body, request_id, watch, trace)
                finally:
                    self.admission.release()
            except asyncio.CancelledError:
                if not watch.disconnected:
                    status = 503  # the proxy shutting down cancelled it: not a bug (500)
                    raise
                uncancel = getattr(asyncio.current_task(), "uncancel", None)
                if uncancel is not None:
                    uncancel()
                raise ProxyError(499, "Client closed the request.", code="client_closed_request") from None
            finally:
                watch.stop()
        except ProxyError as exc:
            status = exc.status
            if status != 499:  # nobody is left to tell
                await send_reply(send, Reply.error(exc, request_id, self.api.error_body))
        except Exception:  # a bug: still an OpenAI error (unless the reply began), and the proxy lives on
            log.exception("unexpected error", extra={"request_id": request_id})
            status = 500
            with contextlib.suppress(Exception):
                await send_reply(
                    send, Reply.error(ProxyError(500, "Internal proxy error."), request_id, self.api.error_body)
                )
        finally:
            self.metrics.inflight.set(self.admission.inflight)
            self._count(status)
            trace.finish(status)
            if status >= 400 or self.access_log:
                log.log(
                    logging.WARNING if status >= 500 else logging.INFO,
                    "%s %s -> %d in %.1f ms",
                    scope["method"],
                    self.path,
                    status,
                    1000 * (time.perf_counter() - started),
                    extra={"request_id": request_id},
                )

    def _count(self, status: int) -> None:
        counter = self._requests_by_status.get(status)
        if counter is None:
            counter = self._requests_by_status[status] = self.metrics.requests.labels(self.endpoint, str(status))
        counter.inc()

    async def _serve(self, body: dict, request_id: str, watch: DisconnectWatch, trace) -> int:
        """Both legs and the reply; a client gone meanwhile cancels them (status 499)."""
        reply = None
        try:
            reply = await self.disaggregator.serve(Exchange(self.api, body, request_id, trace))
            await send_reply(watch.send, reply)
            return reply.status
        finally:
            watch.stop()
            if reply is not None and reply.closer is not None:
                reply.closer.close()


def check_choices(body: dict, max_choices: int) -> None:
    """`n` as vLLM takes it (no greedy n > 1), and bounded: each choice (each prompt of a
    list times `n`) is a prefill and a decode of its own (proxy/flow/fanout.py)."""
    n = body.get("n") or 1
    prompts = prompts_of(body)
    if prompts is not None and choice_count(body) > max_choices:
        raise ProxyError(
            400,
            f"{len(prompts)} prompts with 'n' {n} are {choice_count(body)} choices; this proxy "
            f"serves at most {max_choices} in one request.",
            param="prompt",
        )
    if n > max_choices:
        raise ProxyError(400, f"'n' is {n}; this proxy serves at most {max_choices} choices.", param="n")


class RequestIds:
    """New request ids: 32 hex digits, a random 64-bit prefix drawn once per process (again
    in a forked child) and a counter, so none repeats within a process and two processes'
    collide with odds of 2^-64. (One `secrets.token_hex` per request was a system call on
    the hot path; the ids were never secret: clients may send their own.)"""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"


_new_ids = RequestIds()


def request_id_of(scope) -> str:
    """The client's X-Request-Id if it is sane, else a new one."""
    incoming = header(scope, b"x-request-id")
    if incoming and len(incoming) <= 128 and incoming.isascii() and incoming.isprintable():
        return incoming
    return _new_ids.next()
