"""Early decode: the decode leg sent together with the prefill leg, where the KV is pushed.

With `kv_transfer = "push"` (vLLM's NixlPushConnector) the decode worker allocates the
prompt's blocks, registers them with the prefill worker, and the prefill worker WRITEs the
prompt's KV into them; the two sides match by the request's id. Sent after the prefill
reply, the decode leg starts that round trip only once the prefill is over: each hop waits
for a step of one of the engines (86 ms to the first token for a 1.3-ms WRITE on one H200).
Sent with the prefill leg, the registration is there when the prefill ends, and the WRITE
starts at once.

The decode leg then needs, before the prefill ran, where the KV will come from: the prefill
worker's engine id, NIXL side channel and parallel sizes. They are the same in every reply
of one engine, so they are learned from the worker's previous prefill reply
(`kv_source`, kept in `Worker.kv_source`) and forgotten when the worker is ejected; the
first request to a worker goes the usual way, as do a prefill retry and the fresh prefill of
a decode retry. The early leg's `decode_timeout_s`, if set, runs from its sending, so it
covers the prefill too.

Failure policy (proxy/flow/disagg.py calls these):
- the prefill reply names another engine (the worker restarted between two health
  checks): the early leg is closed (the decode worker's handshake with the old engine id
  fails, and vLLM frees its blocks) and the request goes on the usual way with the reply's
  KV (outcome `stale_source`);
- the prefill leg fails, or the client goes away before it ends: the decode worker holds
  blocks registered with that prefill worker, and vLLM frees them only once a prefill of
  this request id ends there (its push connector has no receive deadline). So the client
  going away never cancels the prefill leg (`prefill` lets it end; should the early leg
  then not receive the KV, the prefill's KV is released as any unused prefill's), and the
  early leg is closed and a prefill that failed before its worker answered is sent once
  more to the same worker in the background (`_complete`). A refused one (4xx) is not: the
  worker computed nothing, and the decode worker, checking the same body the same way,
  refused it too. Should that worker be gone for good, the decode worker keeps those
  blocks until it restarts: the reason early decode is opt-in (`proxy.kv_transfer.early_decode`).
- the early leg itself fails: as any decode attempt that went on the wire (the retry
  prefills again), or, had it never been sent, as one that did not.
Outcomes are counted in `pdspec_proxy_early_decodes_total`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.fleet.pool import Lease, Worker
from proxy.flow.outcomes import LegFailed, PassThrough
from proxy.upstream.client import UpstreamClient, UpstreamError, UpstreamResponse

log = logging.getLogger("pdspec.proxy")

# The fields of a prefill reply's kv_transfer_params that say where its KV comes from: the
# same in every reply of one prefill engine.
SOURCE_FIELDS = ("remote_engine_id", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "transfer_mode")
# What must match for an early leg's registration to reach the engine that prefilled.
IDENTITY_FIELDS = ("remote_engine_id", "remote_host", "remote_port")
# Prefill-leg failures that come after the worker answered 200: its prefill ended, so it
# WRITEs the KV to the early leg's blocks (LegFailed reasons, proxy/flow/outcomes.py).
ANSWERED = frozenset({"bad_reply", "no_kv_params", "foreign_remote_host", "foreign_remote_port"})
OUTCOMES = ("used", "stale_source", "prefill_failed", "client_gone", "completed", "not_completed")


def kv_source(params: dict[str, Any]) -> dict[str, Any] | None:
    """Where a prefill worker's KV comes from, by one of its replies' kv_transfer_params;
    None unless it pushes (a pulled KV needs the prefill's block ids, known only after it)."""
    if params.get("transfer_mode") != "push":
        return None
    return {name: params[name] for name in SOURCE_FIELDS if name in params}


def early_params(source: dict[str, Any], request_id: str) -> dict[str, Any]:
    """The decode leg's kv_transfer_params before its prefill ran: the decode worker
    allocates the prompt's blocks and registers them with `source`, which chooses its own
    blocks when it WRITEs (so none are named here)."""
    return {
        **source,
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [],
        # vLLM requires it; the decode worker names it in the heartbeats that extend a
        # pulled prefill's lease, which a pushed one does not need.
        "remote_request_id": request_id,
    }


def same_source(source: dict[str, Any], params: dict[str, Any]) -> bool:
    return all(params.get(name) == source.get(name) for name in IDENTITY_FIELDS)


class EarlyLeg:
    """A decode leg sent before its prefill ended: `task` opens it (the response and the
    worker's lease, or the decode attempt's error), `sent` says whether it went on the wire."""

    __slots__ = ("decode_worker", "prefill_worker", "source", "task", "sent")

    def __init__(self, decode_worker: Worker, prefill_worker: Worker, source: dict[str, Any]) -> None:
        self.decode_worker = decode_worker
        self.prefill_worker = prefill_worker
        self.source = source
        self.task: asyncio.Future[tuple[UpstreamResponse, Lease]] | None = None
        self.sent = False

    def mark_sent(self) -> None:
        self.sent = True

    def close(self) -> None:
        """Drop the leg: the decode worker aborts its request, and vLLM frees the request's
        blocks once the prefill worker's WRITE (or a failed handshake) ends the receive."""
        task, self.task = self.task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:
            resp, lease = task.result()
            resp.close()
            lease.release()


class EarlyDecode:
    """Sends the early legs' prefills and settles the legs that were not used."""

    def __init__(self, client: UpstreamClient, metrics, worker_headers: dict[str, str]):
        self.client = client
        self.outcomes = {outcome: metrics.early_decodes.labels(outcome) for outcome in OUTCOMES}
        self.worker_headers = worker_headers
        self._background: set[asyncio.Future] = set()

    async def prefill(
        self,
        early: EarlyLeg,
        path: str,
        leg: bytes,
        request_id: str,
        run: Awaitable[Any],
        release: Callable[[Any], None],
    ) -> Any:
        """`run` (the prefill leg) to its end, whatever becomes of this request: a prefill
        that ends WRITEs the KV, and that frees the decode worker's registered blocks. If
        it fails, or the client leaves, the early leg is settled (`_settle`); `release(the
        prefill's result)` frees the KV of a prefill that ended after its client left when
        the early leg will not receive it."""
        task = asyncio.ensure_future(run)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self.outcomes["client_gone"].inc()
            self._keep(task).add_done_callback(
                functools.partial(self._settle, early, path, leg, request_id, release=release)
            )
            raise
        except BaseException:
            self.outcomes["prefill_failed"].inc()
            self._settle(early, path, leg, request_id, task, release=release)
            raise

    def adopt(self, early: EarlyLeg, params: dict[str, Any]) -> bool:
        """Whether the prefill that ended (its reply's kv_transfer_params) is the one the
        early leg registered with (counted `used`: the leg gets its KV); if not, the leg is
        closed."""
        if same_source(early.source, params):
            self.outcomes["used"].inc()
            return True
        self.outcomes["stale_source"].inc()
        log.warning(
            "prefill worker %s answered as engine %s, not %s: early decode leg dropped",
            early.prefill_worker.url,
            params.get("remote_engine_id"),
            early.source.get("remote_engine_id"),
        )
        early.close()
        return False

    def _settle(
        self,
        early: EarlyLeg,
        path: str,
        leg: bytes,
        request_id: str,
        prefill: asyncio.Future,
        *,
        release: Callable[[Any], None],
    ) -> None:
        """The early leg of a request that will not use it, closed; first:
        - a prefill that ended (its client gone): if the leg will not receive its KV (it
          never went out, was refused, or registered with another engine), `release`;
        - a prefill that failed before its worker answered: sent once more to that worker
          (`_complete`), which WRITEs the leg's registered blocks;
        - refused (4xx) or answered: nothing to add (refused, the worker computed nothing;
          the decode worker checks the same body the same way, so it refused too)."""
        failure = None if prefill.cancelled() else prefill.exception()
        if not prefill.cancelled() and failure is None:
            params = getattr(prefill.result(), "kv_transfer_params", None) or {}
            receives = early.sent and not _worker_4xx(early.task) and same_source(early.source, params)
            early.close()
            if not receives:
                release(prefill.result())
        elif isinstance(failure, PassThrough) or (isinstance(failure, LegFailed) and failure.reason in ANSWERED):
            early.close()
        else:  # cancelled, or failed before its worker answered
            self._keep(asyncio.ensure_future(self._complete(early, path, leg, request_id)))

    async def _complete(self, early: EarlyLeg, path: str, leg: bytes, request_id: str) -> None:
        refused = _worker_4xx(early.task)
        early.close()  # a leg not yet on the wire never will be
        if not early.sent or refused:
            return  # nothing was registered: the leg did not reach the decode worker, or it refused the request
        worker, outcome = early.prefill_worker, "not_completed"
        try:
            with worker.lease():
                resp = await self.client.request(
                    worker.url,
                    "POST",
                    path,
                    leg,
                    {"X-Request-Id": request_id, **self.worker_headers},
                    # No cap but the idle timeout: it may wait behind the work
                    # that made the first leg time out, and cut short it would
                    # leave the blocks held as surely as none at all.
                    None,
                )
                await resp.read()
            outcome = "completed" if resp.status == 200 else "not_completed"
        except UpstreamError as exc:
            log.warning("could not complete the prefill of an early decode leg on %s (%s)", worker.url, exc.reason)
        finally:
            self.outcomes[outcome].inc()
        if outcome != "completed":
            log.warning(
                "decode worker %s holds the blocks of request %s until it restarts (its prefill on %s never ended)",
                early.decode_worker.url,
                request_id,
                worker.url,
            )

    def _keep(self, task: asyncio.Future) -> asyncio.Future:
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task


def _worker_4xx(task: asyncio.Future | None) -> bool:
    """Whether the decode worker answered the leg with a 4xx: vLLM refuses a request before
    it allocates blocks, so none were registered. A leg still open counts as accepted."""
    if task is None or not task.done() or task.cancelled():
        return False
    return isinstance(task.exception(), PassThrough)
