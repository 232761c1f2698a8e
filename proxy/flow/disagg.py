"""One disaggregated request: prefill leg, KV hand-off, decode leg, relay to the client.

The same for every API the proxy serves; what differs between them (validation, legs,
usage, stream framing) is their `Api` (proxy/apis/api.py), built in each API's module under
proxy/apis/. A request travels as an `Exchange` (proxy/flow/exchange.py); a leg that does
not end in the reply it wanted ends in one of the outcomes of proxy/flow/outcomes.py.

Failure handling, in order of the request's life:
- prefill leg: a worker's 4xx goes back to the client as is (its fault, no retry);
  a 5xx, connection error or timeout follows `prefill_failure_policy`: `error` returns
  it, `retry` tries other prefill workers (bounded, with backoff), `fallback` sends the
  request to a decode worker without KV params, which then prefills it itself;
- hand-off: the prefill worker's `kv_transfer_params` must name that worker's own host
  (or one of `kv_transfer.source_hosts`) and a port of `kv_transfer.source_ports`, so no reply can steer a
  decode worker to pull KV from anywhere else;
- decode leg: retried on another decode worker only before its first byte reached the
  client; afterwards a broken stream ends with an SSE error event, never a hang. A
  prefill's KV goes to one decode request only: a worker that got the leg may read the KV
  later (a hung one, when it resumes) or have it freed (vLLM does on an abort or a
  refusal), and a second read after that free caches another request's KV under this
  prompt on the decode worker. So a retry after a sent leg prefills again
  (pdspec_proxy_kv_reprefills_total) rather than resend the KV;
- decode-only: a request vLLM cannot serve through P/D (`legs.decode_only_reason`:
  beam search; grammar-constrained ones too under `structured_outputs = "decode_only"`)
  goes whole to a decode worker, which prefills it itself (or, when its route plan says
  decode_full, to that prefill worker first: no KV moves either way);
- decode_full (conditional disaggregation, proxy/routing/plan.py's `decode_full_on`): a
  request no decode worker has KV room for goes whole, without KV params, to the prefill
  worker its route plan chose, leased there as a decode leg; if that leg fails before its
  reply begins (connection error, timeout, 5xx), the decode pool's attempts follow, as for
  a decode-only request; a 4xx goes back as any leg's. It makes no KV to hand over or release;
- pending decode KV (conditional disaggregation): a request its plan disaggregates leases its
  prompt tokens in the decode pool's `decode_pending_tokens` (what decode_full weighs with
  `routing.decode_full_counts_pending`) from its plan until its first decode leg leases a
  decode worker's KV (`_open_decode`, an early leg's included, a fallback's without KV too),
  or the request ends any other way (a failed prefill, a 4xx, no decode worker, the client
  gone, a cancel): `_serve_one`'s `finally`. The lease's release is idempotent;
- release: when no decode leg with a good prefill's KV went on the wire (decode worker
  unreachable or none healthy, client gone between the legs), a one-token leg frees the
  KV (`_release_kv`); once one went, that worker frees it (vLLM does on an abort or a
  refusal) or, had it died, the KV lease does: a release would be the second read above.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from pdspec.settings import ProxySettings, port_range
from proxy.admission.kv_room import KvRoom, Leg, reply_prompt_tokens
from proxy.apis.api import Api
from proxy.asgi import Reply
from proxy.auth import worker_auth_headers
from proxy.errors import ProxyError
from proxy.fleet.pool import NoHealthyWorker, PendingDecode, Worker, WorkerPool
from proxy.flow.attempts import attempts, backoff
from proxy.flow.early_decode import EarlyDecode, EarlyLeg, early_params, kv_source
from proxy.flow.exchange import Exchange
from proxy.flow.fanout import choice_count, fan_out
from proxy.flow.outcomes import DecodeFailed, LegFailed, PassThrough, release_reason, status_class
from proxy.flow.relay import Relay, RelayMetrics
from proxy.metrics import ProxyMetrics
from proxy.routing.kv_router import KvRouter
from proxy.routing.plan import RoutePlan, kv_held_tokens, leg_key, local_prefill_tokens, pending_decode_tokens
from proxy.routing.policies.kv_aware import decode_tokens, uncached_tokens
from proxy.upstream.client import UpstreamClient, UpstreamError, UpstreamResponse

log = logging.getLogger("pdspec.proxy")


def server_timing(**durations_s: float) -> str:
    """A Server-Timing header (W3C) of the request's phases, in milliseconds: `route` (the
    route plan: token ids, cache lookup), `prefill` (the prefill leg, retries and the wait
    for KV room under `admission.prefill_kv` included; 0 when the worker that decoded
    prefilled), `decode` (to the decode reply's headers when it streams, to its end when
    not: the KV pull and the first token come after them; a re-prefill after a failed KV
    read counts here)."""
    return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in durations_s.items())


@dataclass(slots=True)
class Prefilled:
    """What the prefill leg hands to the decode leg."""

    kv_transfer_params: dict[str, Any] | None  # None: decode-only fallback
    cached_tokens: int | None  # the prefill worker's prefix-cache hits
    # A decode leg carrying these kv_transfer_params went on the wire: that worker may read
    # the KV or have it freed, so no other leg may carry them (see the module docstring).
    handed_over: bool = False
    worker_url: str | None = None  # the prefill worker (None: the decode worker prefills)
    prompt_tokens: int | None = None  # as the prefill reply counted them
    early: EarlyLeg | None = None  # the decode leg sent with the prefill leg (proxy/flow/early_decode.py)
    usage: Any = None  # what the API's patchers take from the prefill reply (Api.prefill_usage_of)


class Disaggregator:
    def __init__(
        self,
        client: UpstreamClient,
        prefill_pool: WorkerPool,
        decode_pool: WorkerPool,
        metrics: ProxyMetrics,
        settings: ProxySettings,
        kv_router: KvRouter | None = None,
        kv_room: KvRoom | None = None,
    ) -> None:
        self.client = client
        self.kv_router = kv_router  # cache-aware routing (proxy/routing/kv_router.py), when a setting asks for it
        self.kv_room = kv_room  # admission by the prefill workers' KV room (proxy/admission/kv_room.py), when asked for
        self.prefill_pool = prefill_pool
        self.decode_pool = decode_pool
        self.metrics = metrics
        self.settings = settings
        self.worker_headers = worker_auth_headers(settings.worker_client.api_key)
        # Children of the metrics every request touches, bound once (labels() costs a lock).
        self.prefill_seconds = metrics.leg_seconds.labels("prefill")
        self.relay_metrics = RelayMetrics.of(metrics)  # what the decode replies' relays count
        self.prefill_ok = metrics.prefill_outcomes.labels("ok")
        self._releases: set[asyncio.Task] = set()
        self.kv_source_ports = [port_range(spec) for spec in settings.kv_transfer.source_ports]
        self.early = EarlyDecode(client, metrics, self.worker_headers) if settings.kv_transfer.early_decode else None

    async def serve(self, ex: Exchange) -> Reply:
        reason = ex.api.decode_only_reason(ex.body)
        if reason == "structured_output" and self.settings.routing.structured_outputs == "disaggregated":
            reason = None
        if reason is not None:
            self.metrics.decode_only.labels(reason).inc()
            return await self._serve_one(ex, decode_only=True)
        if ex.api.fans_out and choice_count(ex.body) > 1:  # one prefill + decode per choice: see proxy/flow/fanout.py
            return await fan_out(lambda sub, rid: self._serve_one(ex.choice(sub, rid)), ex.body, ex.request_id)
        return await self._serve_one(ex)

    async def _serve_one(self, ex: Exchange, decode_only: bool = False) -> Reply:
        """One prefill and decode, or with `decode_only` the decode leg alone (no KV params:
        the decode worker prefills, and there is no prefill KV to release). With cache-aware
        routing the route is planned first: the decode worker, and whether it prefills
        the prompt itself or a prefill worker serves the request whole (conditional
        disaggregation: either way decode-only, counted by reason). A request decode-only for
        its own reason (`decode_only`) follows the plan's worker too, counted as such alone."""
        started = time.perf_counter()
        ex.plan = plan = await self.kv_router.plan(ex.body, ex.api) if self.kv_router is not None else None
        if plan is not None and plan.local_prefill is not None and not decode_only:
            self.metrics.local_prefills.labels(plan.local_prefill).inc()
            decode_only = True
        # Disaggregated: its prompt is pending decode KV until its decode leg leases some.
        # Counted before anything awaits, so the next request's plan sees it; released
        # below (`finally`) whatever way the request ends, or earlier by `_open_decode`.
        tokens = 0 if decode_only else pending_decode_tokens(plan)
        if tokens:
            ex.pending_decode = self.decode_pool.pend_decode(tokens)
        try:
            routed_at = time.perf_counter()
            prefilled = Prefilled(None, None) if decode_only else await self._prefill(ex)
            try:
                prefilled_at = time.perf_counter()
                reply = await self._decode(ex, prefilled)
                if self.settings.observability.served_by_headers:
                    reply.headers["X-Pdspec-Prefill-Worker"] = prefilled.worker_url or "local"
                    reply.headers["Server-Timing"] = server_timing(
                        route=routed_at - started,
                        prefill=prefilled_at - routed_at,
                        decode=time.perf_counter() - prefilled_at,
                    )
                return reply
            except BaseException as exc:
                # Once handed over, the decode worker frees the KV when it aborts or refuses
                # the request (vLLM's `_with_kv_transfer_rejection_cleanup`), or the lease
                # does; before that, nothing would free it until the lease ends.
                if prefilled.kv_transfer_params is not None and not prefilled.handed_over:
                    self._release_kv(ex, prefilled, release_reason(exc))
                raise
        except PassThrough as passthrough:
            passthrough.reply.headers["X-Request-Id"] = ex.request_id
            return passthrough.reply
        finally:
            if ex.pending_decode is not None:
                ex.pending_decode.release()

    # --- prefill ---------------------------------------------------------------------

    async def _prefill(self, ex: Exchange, early_ok: bool = True) -> Prefilled:
        """The prefill leg, tried as `prefill_failure_policy` says; its first attempt sends
        the decode leg along where early decode applies (`early_ok`: not for a decode
        retry's fresh KV, whose decode leg `_decode` sends itself)."""
        policy = self.settings.retries.prefill_failure_policy
        tries = 1 + (self.settings.retries.prefill_retries if policy == "retry" else 0)
        api, plan, trace = ex.api, ex.plan, ex.trace
        key = leg_key(ex.body, plan, self.prefill_pool.policy)
        leg = orjson.dumps(api.prefill_body(ex.body))
        failure: LegFailed | None = None
        cached = plan.prefill_cached if plan is not None else None
        (tokens, chars), full = (0, 0), set()
        if self.kv_room is not None:
            (tokens, chars) = self.kv_room.tokens_of(ex.body, plan.prompt_tokens if plan is not None else None)
            full |= await self.kv_room.wait_for_room(tokens)
        building = plan.prefill_building if plan is not None else None
        prompt_tokens = plan.prompt_tokens if plan is not None else 0
        for attempt, worker in attempts(
            self.prefill_pool, tries, key, cached, exclude=full, building=building, prompt_tokens=prompt_tokens
        ):
            if self.kv_router is not None:
                self.kv_router.routed(self.prefill_pool, worker, plan)
            span = trace.start("prefill", **{"pdspec.worker": worker.url, "pdspec.attempt": attempt})
            prefilled = None
            early = self._start_early(ex, worker) if attempt == 0 and early_ok else None
            try:
                run = self._prefill_once(
                    worker,
                    api,
                    leg,
                    ex.request_id,
                    trace.headers(span),
                    uncached_tokens(plan, worker),
                    kv_held_tokens(plan),
                )
                if self.kv_room is not None:  # counted as long as it runs there, its client gone or not;
                    # begun here, ended by the coroutine: nothing may run between this and `await run`
                    run = self._counted(run, self.kv_room.begin(worker.url, tokens, chars))
                if early is not None:  # the prefill must end (see proxy/flow/early_decode.py)
                    release = functools.partial(self._release_kv, ex, reason="client_gone")
                    run = self.early.prefill(early, api.path, leg, ex.request_id, run, release)
                prefilled = await run
                if early is not None and self.early.adopt(early, prefilled.kv_transfer_params):
                    prefilled.early = early
            except LegFailed as exc:
                trace.end(span, exc.message)
                failure = exc
                self.metrics.leg_failures.labels("prefill", exc.reason).inc()
            except PassThrough:
                trace.end(span, "worker 4xx")
                raise
            if prefilled is None:  # failed: pause, then the next worker, if it has room by then
                await backoff(attempt, tries, self.settings.retries.backoff_s)
                if self.kv_room is not None and attempt + 1 < tries:
                    full.clear()  # `attempts` reads it at each pick
                    full |= await self.kv_room.wait_for_room(tokens)
                continue
            trace.end(span)
            (self.prefill_ok if attempt == 0 else self.metrics.prefill_outcomes.labels("retried_ok")).inc()
            return prefilled
        failure = failure or LegFailed(503, "no healthy prefill worker", "no_healthy_worker")
        if policy == "fallback":
            # The decode worker prefills the prompt itself: slower, but the request lives.
            self.metrics.prefill_outcomes.labels("fallback").inc()
            log.warning(
                "prefill failed (%s); decode-only fallback", failure.message, extra={"request_id": ex.request_id}
            )
            return Prefilled(None, None)
        self.metrics.prefill_outcomes.labels("error").inc()
        raise ProxyError(failure.status, failure.message)

    async def _counted(self, run: Awaitable[Prefilled], room_leg: Leg) -> Prefilled:
        """`run`, with admission's count of its leg ended when the leg ends: by its reply's
        count of the KV it holds there (none if it failed); its time charged to the worker's
        rate when it answered or timed out (not when its client left)."""
        prefilled, charged = None, False
        try:
            prefilled = await run
            charged = True
            return prefilled
        except LegFailed as exc:
            charged = exc.reason == "timeout"
            raise
        finally:
            self.kv_room.end(
                room_leg,
                prefilled and (prefilled.prompt_tokens or room_leg.tokens),
                prefilled and prefilled.cached_tokens,
                charged,
            )

    async def _prefill_once(
        self,
        worker: Worker,
        api: Api,
        leg: bytes,
        request_id: str,
        trace_headers,
        uncached_tokens: int = 0,
        held: int = 0,
    ) -> Prefilled:
        started = time.perf_counter()
        with worker.lease(uncached_tokens, held=held):
            try:
                resp = await self.client.request(
                    worker.url,
                    "POST",
                    api.path,
                    leg,
                    {"X-Request-Id": request_id, **self.worker_headers, **trace_headers},
                    self.settings.worker_client.prefill_timeout_s,
                )
                data = await resp.read()
            except UpstreamError as exc:
                raise self._leg_failed("prefill", worker, exc) from None
        if resp.status != 200:
            raise self._worker_error("prefill", worker, resp, data)
        self.prefill_seconds.observe(time.perf_counter() - started)
        try:
            reply = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise LegFailed(502, f"prefill worker {worker.url} sent a body that is not JSON", "bad_reply") from None
        params = reply.get("kv_transfer_params") if isinstance(reply, dict) else None
        if not isinstance(params, dict):
            # Without it the decode worker would silently recompute the prompt.
            raise LegFailed(502, "Prefill worker returned no kv_transfer_params; is it a kv_producer?", "no_kv_params")
        self._check_remote(params, worker)
        worker.kv_source = kv_source(params)
        cached = api.cached_tokens_of(reply)
        usage = cached if api.prefill_usage_of is None else api.prefill_usage_of(reply)
        return Prefilled(params, cached, worker_url=worker.url, prompt_tokens=reply_prompt_tokens(reply), usage=usage)

    def _check_remote(self, params: dict, worker: Worker) -> None:
        """The decode worker will connect to (remote_host, remote_port) and pull KV from
        it: it must be the NIXL side channel of the prefill worker that answered. The
        host must be that worker's own (or listed in `kv_transfer.source_hosts`); a missing one
        is refused too (vLLM's would then be whatever the decode side defaults to); the
        port must be an integer in `kv_transfer.source_ports`."""
        host = params.get("remote_host")
        if not isinstance(host, str) or not (host == worker.host or host in self.settings.kv_transfer.source_hosts):
            raise LegFailed(
                502,
                f"prefill worker {worker.url} named a KV source that is not its own: remote_host={host!r}",
                "foreign_remote_host",
            )
        port = params.get("remote_port")
        if type(port) is not int or not any(low <= port <= high for low, high in self.kv_source_ports):
            raise LegFailed(
                502,
                f"prefill worker {worker.url} named a KV source port outside kv_transfer.source_ports: remote_port={port!r}",
                "foreign_remote_port",
            )

    def _leg_failed(self, leg: str, worker: Worker, exc: UpstreamError) -> LegFailed:
        status = 504 if exc.reason == "timeout" else 502
        return LegFailed(status, f"{leg} worker {worker.url} failed: {exc.reason}", exc.reason)

    def _worker_error(self, leg: str, worker: Worker, resp: UpstreamResponse, data: bytes):
        if 400 <= resp.status < 500:
            self.metrics.leg_failures.labels(leg, f"http_{resp.status}").inc()
            content_type = resp.headers.get("content-type", "application/json")
            return PassThrough(Reply(resp.status, data, content_type=content_type))
        text = data[:200].decode("utf-8", "replace")
        return LegFailed(502, f"{leg} worker {worker.url} answered HTTP {resp.status}: {text}", f"http_{resp.status}")

    async def _prefill_again(self, ex: Exchange, prefilled: Prefilled, failure: LegFailed | None) -> None:
        """Fresh KV for a decode retry whose previous attempt was handed the old KV
        (`prefilled` updated in place); a failure here ends the request as any prefill's."""
        self.metrics.kv_reprefills.labels(status_class(failure.reason) if failure is not None else "unknown").inc()
        fresh = await self._prefill(ex, early_ok=False)
        for name in Prefilled.__slots__:  # its KV, hits and worker; not handed over
            setattr(prefilled, name, getattr(fresh, name))

    # --- a prefill whose decode will never come ---------------------------------------

    def _release_kv(self, ex: Exchange, prefilled: Prefilled, reason: str) -> None:
        """The prefill worker holds the prompt's KV for a decode that will never come, and
        would keep it until its KV lease ends (`worker.kv_lease_s`, 120 s by default),
        blocks other requests could use. vLLM has no call to drop it; what frees it is a
        decode worker reading it. So a one-token decode is sent in the background and its
        answer thrown away (counted in pdspec_proxy_kv_releases_total by reason and
        outcome). Sent once per prefill: `kv_transfer_params` is cleared."""
        params, prefilled.kv_transfer_params = prefilled.kv_transfer_params, None
        leg = orjson.dumps(ex.api.release_body(ex.body, params))
        task = asyncio.ensure_future(self._release_once(ex.api.path, leg, ex.request_id, reason))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _release_targets(self) -> list[Worker]:
        """Healthy decode workers first (in the pool's routing order); when none is
        healthy, ejected ones that were healthy once: such a worker may still read the
        KV, and nothing else can free it. A worker never admitted, or refused by the
        pairing check (its drafter or block size differs), is never tried."""
        targets: list[Worker] = []
        for _ in range(1 + self.settings.retries.decode_retries):
            try:
                targets.append(self.decode_pool.pick(exclude={w.url for w in targets}))
            except NoHealthyWorker:
                break
        if not targets:
            ejected = [w for w in self.decode_pool.workers if w.seen_healthy and w.refusal is None]
            targets = ejected[: 1 + self.settings.retries.decode_retries]
        return targets

    async def _release_once(self, path: str, leg: bytes, request_id: str, reason: str) -> None:
        outcome = "no_decode_worker"
        for worker in self._release_targets():
            with worker.lease():
                try:
                    resp = await self.client.request(
                        # The prefill's own request id: a push prefill worker (NixlPushConnector)
                        # finds the blocks to WRITE by the decode request's id, not by
                        # kv_transfer_params, so another id would leave them held.
                        worker.url,
                        "POST",
                        path,
                        leg,
                        {"X-Request-Id": request_id, **self.worker_headers},
                        self.settings.worker_client.decode_timeout_s,
                    )
                    await resp.read()
                    outcome = "ok" if resp.status == 200 else status_class(f"http_{resp.status}")
                except UpstreamError as exc:
                    outcome = exc.reason
            if outcome == "ok":
                break
        self.metrics.kv_releases.labels(reason, outcome).inc()
        log.info(
            "released the prefill KV of a request whose decode will not come (%s): %s",
            reason,
            outcome,
            extra={"request_id": request_id},
        )

    # --- decode ----------------------------------------------------------------------

    def _decode_attempts(self, ex: Exchange, tries: int, first: Worker | None = None):
        plan = ex.plan
        cached = plan.decode_cached if plan is not None else None
        # The plan's decode worker (conditional disaggregation's, proxy/routing/kv_router.py)
        # binds a prompt it prefills itself, which it was chosen for, and any leg of a pool
        # whose policy reads no load (round_robin: picking again would only take a second
        # turn). Else a leg is picked when it leaves (early decode: when the prefill leg
        # does), on the loads then: the pool counts a decode leg from its hand-off, so picks
        # made at arrival all saw the counts of before a burst, and the requests arriving
        # within one prefill leg's time went to the worker with the fewest legs open then
        # (the fleet benchmark's kv_aware tail:
        # loadtest/results/fleet/h200-qwen3-8b/round2/tail-analysis.md). A cache-aware
        # pool still weighs what the plan found each worker holding at arrival.
        # A request a prefill worker serves whole (decode_full) was judged on the decode
        # pool, not bound to its worker: should it come back, it is picked as any leg is.
        planned = None
        decode_worker_prefills = plan is not None and plan.local_prefill is not None and plan.whole_on is None
        if plan is not None and (decode_worker_prefills or not self.decode_pool.policy.reads_load):
            planned = plan.decode_worker
        key = leg_key(ex.body, plan, self.decode_pool.policy)
        decode_pool = attempts(self.decode_pool, tries, key, cached, first or planned)
        if plan is None or plan.whole_on is None:
            return decode_pool
        # decode_full: the prefill worker the plan chose first; if that leg fails before its
        # reply begins, the decode pool's attempts, as a decode-only request's: the request lives.
        whole = [(0, plan.whole_on)] if plan.whole_on in self.prefill_pool.healthy() else []
        return itertools.chain(whole, ((attempt + len(whole), worker) for attempt, worker in decode_pool))

    @staticmethod
    def _decode_load(plan: RoutePlan | None, worker: Worker, with_kv: bool) -> dict[str, int]:
        """What a decode leg leases of `worker` (`Worker.lease`'s counts, besides the leg itself):
        the prompt tokens it holds in the worker's KV (`kv_held_tokens`, conditional
        disaggregation's count). A request served whole on a prefill worker (decode_full) also
        leases the prompt tokens it computes there until its first token (`computing`), what
        the prefill pool's kv_aware counts as a prefill leg's load. Any other leg: what it
        holds as the decode pool's kv_aware load (`decode_tokens`) and, without KV (`with_kv`
        False; per attempt, since a retry's prefill may have fallen back to none), the prompt
        tokens its worker prefills first, which conditional disaggregation reads as that
        worker's queue (`local_prefill_tokens`)."""
        held = kv_held_tokens(plan)
        if plan is not None and worker is plan.whole_on:
            return {"held": held, "computing": uncached_tokens(plan, worker)}
        prefilling = 0 if with_kv else local_prefill_tokens(plan, worker)
        return {"tokens": decode_tokens(plan), "prefilling": prefilling, "held": held}

    def _start_early(self, ex: Exchange, prefill_worker: Worker) -> EarlyLeg | None:
        """The decode leg, sent now with the prefill leg to `prefill_worker` where that
        works (proxy/flow/early_decode.py); None: it goes the usual way, after the prefill."""
        if self.early is None or prefill_worker.kv_source is None:
            return None
        picked = next(self._decode_attempts(ex, 1), None)
        if picked is None:
            return None  # no healthy decode worker: the usual way says so
        early = EarlyLeg(picked[1], prefill_worker, prefill_worker.kv_source)
        leg = orjson.dumps(ex.api.decode_body(ex.body, early_params(early.source, ex.request_id)))
        early.task = asyncio.ensure_future(
            self._open_decode(
                early.decode_worker,
                ex.api.path,
                leg,
                ex.request_id,
                ex.trace.headers(None),
                early.mark_sent,
                self._decode_load(ex.plan, early.decode_worker, with_kv=True),
                ex.pending_decode,
            )
        )
        return early

    async def _decode(self, ex: Exchange, prefilled: Prefilled) -> Reply:
        api, body, request_id, trace, plan = ex.api, ex.body, ex.request_id, ex.trace, ex.plan
        headers = {"X-Request-Id": request_id}
        leg = orjson.dumps(api.decode_body(body, prefilled.kv_transfer_params))
        disaggregated = prefilled.kv_transfer_params is not None
        handoff = trace.start("handoff") if prefilled.kv_transfer_params else None
        # Timed apart from the span, which is None when tracing is off.
        handoff_started = time.perf_counter() if prefilled.kv_transfer_params else None
        failure: LegFailed | None = None
        tries = 1 + self.settings.retries.decode_retries
        early, prefilled.early = prefilled.early, None  # the first attempt, already on its way

        def sent() -> None:
            prefilled.handed_over = prefilled.kv_transfer_params is not None

        try:
            for attempt, worker in self._decode_attempts(ex, tries, early and early.decode_worker):
                if early is not None and worker is not early.decode_worker:  # ejected meanwhile
                    early = self._drop_early(early, prefilled)
                if disaggregated and prefilled.handed_over and early is None:
                    # The failed attempt may still read this KV: this one gets KV of its own.
                    await self._prefill_again(ex, prefilled, failure)
                    leg = orjson.dumps(api.decode_body(body, prefilled.kv_transfer_params))
                whole = plan is not None and worker is plan.whole_on  # decode_full: a prefill worker's
                if self.kv_router is not None:
                    self.kv_router.routed(self.prefill_pool if whole else self.decode_pool, worker, plan)
                if self.settings.observability.served_by_headers:
                    headers["X-Pdspec-Decode-Worker"] = worker.url
                span = trace.start("decode", **{"pdspec.worker": worker.url, "pdspec.attempt": attempt})
                try:
                    if early is not None:
                        resp, lease = await early.task
                        early.task = None  # the relay owns the response now
                        sent()
                    else:
                        resp, lease = await self._open_decode(
                            worker,
                            api.path,
                            leg,
                            request_id,
                            trace.headers(span),
                            sent,
                            self._decode_load(plan, worker, prefilled.kv_transfer_params is not None),
                            ex.pending_decode,
                        )
                except LegFailed as exc:
                    early = self._drop_early(early, prefilled)
                    trace.end(span, exc.message)
                    failure = exc
                    self.metrics.leg_failures.labels("decode", exc.reason).inc()
                    await backoff(attempt, tries, self.settings.retries.backoff_s)
                    continue
                except PassThrough:
                    trace.end(span, "worker 4xx")
                    trace.end(handoff, "decode refused")
                    raise
                relay = Relay(self.relay_metrics, resp, worker, lease, trace, span, handoff, handoff_started)
                if body.get("stream"):
                    relay.preamble_events = api.preamble_events
                    stream, relay.error_event = api.stream(relay.chunks(), prefilled.usage)
                    return Reply(200, content_type="text/event-stream", stream=stream, headers=headers, closer=relay)
                data = await relay.read()
                return Reply(200, api.patch_body(data, prefilled.usage), headers=headers)
        finally:
            self._drop_early(early, prefilled)  # the client went away while it opened
        trace.end(handoff, "no decode")
        raise DecodeFailed(failure or LegFailed(503, "no healthy decode worker", "no_healthy_worker"))

    @staticmethod
    def _drop_early(early: EarlyLeg | None, prefilled: Prefilled) -> None:
        """An early leg no attempt will use: closed; if it went on the wire, that worker was
        handed the KV (the prefill worker WRITEs it there), as for any decode attempt."""
        if early is not None and early.task is not None:
            early.close()
            prefilled.handed_over = prefilled.handed_over or early.sent
        return None

    async def _open_decode(
        self,
        worker: Worker,
        path: str,
        leg: bytes,
        request_id: str,
        trace_headers,
        on_sent: Callable[[], None],
        load: dict[str, int] | None = None,
        pending: PendingDecode | None = None,
    ):
        """The decode response, checked before any byte goes to the client: once a
        streaming response has started, its status can no longer change. `on_sent`: called
        once the leg went on the wire (the worker may then read its KV); `load`: what the
        leg's lease holds of the worker (`_decode_load`; its prefill work until the relay's
        first byte after the preamble); `pending`: the request's pending decode KV, released
        as this lease takes its prompt into the worker's `kv_held_tokens` (a decode pool's
        worker: a plan that disaggregates has no `whole_on`). Should this attempt fail, the
        prompt is not pending again until the next one leases: a retry whose KV was already handed
        over prefills again first (`_prefill_again`, a whole prefill leg) with it in neither
        count, which errs towards room for that while (retries are rare)."""
        lease = worker.lease(computed=False, **(load or {}))
        if pending is not None:
            pending.release()
        try:
            resp = await self.client.request(
                worker.url,
                "POST",
                path,
                leg,
                {"X-Request-Id": request_id, **self.worker_headers, **trace_headers},
                self.settings.worker_client.decode_timeout_s,
                on_sent=on_sent,
            )
        except UpstreamError as exc:
            lease.release()
            raise self._leg_failed("decode", worker, exc) from None
        except BaseException:
            lease.release()
            raise
        if resp.status != 200:
            lease.release()
            try:
                data = await resp.read()
            except UpstreamError:
                data = b""
            raise self._worker_error("decode", worker, resp, data)
        return resp, lease
