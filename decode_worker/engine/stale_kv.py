"""The stale-KV guard of a decode worker: never read a prefill's KV that may have expired.

A prefill worker keeps a prompt's KV for a lease (`kv_lease_duration` of the KV connector)
that starts when its prefill ends; the decode worker renews it with heartbeats once its
scheduler has the request. A decode engine that stalls (seen: about 50 s after a prefill
worker it was reading from was killed, NIXL waiting on the dead peer) neither renews nor
takes new requests, so the leases of requests that reached its API server meanwhile run
out, the prefill worker frees and reuses those blocks, and the decode worker, once it
runs again, reads whatever is there: another request's KV, which it then caches under this
prompt's block hashes. vLLM only logs it on the prefill side ("Potentially invalid KV blocks
for unrecognized request ... were retrieved"). The chaos soak's wrong outputs came from it.

So when the scheduler gets a request whose KV is remote and which arrived (at this
worker's API server, vLLM's `arrival_time`) longer ago than `stale_after_s` (half the
lease: the hop from the prefill's end to the decode worker's arrival is milliseconds, and
no heartbeat can have renewed a request the scheduler never had), the guard drops the
request's `kv_transfer_params`: the decode worker prefills the prompt itself, as for a
failed KV load. Counted in `pdspec_stale_kv_recomputed_total`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import ROLE_ENV, STALE_KV_AFTER_ENV
from pdspec.worker.engine.metrics import STALE_KV_RECOMPUTED

log = logging.getLogger("pdspec.engine")


def stale_after_from_env() -> float | None:
    """The guard's age limit in seconds (None: off, as on a prefill worker)."""
    value = os.environ.get(STALE_KV_AFTER_ENV)
    return float(value) if value else None


def start_guard() -> float | None:
    """The limit, with the guard's state reported (the decode role's feature)."""
    limit = stale_after_from_env()
    if os.environ.get(ROLE_ENV) == "decode":
        features.report(features.STALE_KV_GUARD, limit is not None, f"{STALE_KV_AFTER_ENV} is not set")
    return limit


def remote_kv_is_stale(request: Any, now: float, stale_after_s: float) -> bool:
    params = getattr(request, "kv_transfer_params", None)
    if not params or not params.get("do_remote_prefill"):
        return False
    return now - float(request.arrival_time) > stale_after_s


class StaleKvMixin:
    """In front of vLLM's scheduler (scheduler.py puts it there, ahead of the K=0 rule);
    its limit is read, and the guard's state reported, when the scheduler is made."""

    _pdspec_stale_after_s: float | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pdspec_stale_after_s = start_guard()

    def add_request(self, request: Any) -> None:
        limit = self._pdspec_stale_after_s
        if limit is not None and remote_kv_is_stale(request, time.time(), limit):
            log.warning(
                "request %s reached the scheduler %.1f s after its arrival, past the %.1f s its prefill "
                "worker's KV lease is trusted for: prefilled here instead of reading that KV",
                request.request_id,
                time.time() - request.arrival_time,
                limit,
            )
            request.kv_transfer_params = None
            STALE_KV_RECOMPUTED.inc()
        super().add_request(request)  # type: ignore[misc]
