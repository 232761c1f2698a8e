"""One client request on its way through P/D, as every step of the flow sees it: its API,
its body, its request id, its trace and, once it is routed, its route plan (and, when that
plan disaggregates it, its lease of the decode pool's pending KV count). Built by the
endpoint (proxy/edge/endpoint.py) and handed from step to step instead of the five values; a
fanned-out request (proxy/flow/fanout.py) makes one per choice (`choice`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.apis.api import Api
from proxy.fleet.pool import PendingDecode
from proxy.routing.plan import RoutePlan
from proxy.tracing import NO_TRACE, NoTrace


@dataclass(slots=True)
class Exchange:
    api: Api
    body: dict[str, Any]
    request_id: str
    trace: NoTrace = NO_TRACE
    plan: RoutePlan | None = None  # cache-aware routing's plan, set when it routed the request
    # Conditional disaggregation, a request the plan disaggregates: its prompt tokens in the
    # decode pool's `decode_pending_tokens` until its decode leg leases a decode worker's KV
    # or the request ends (proxy/flow/disagg.py releases it either way).
    pending_decode: PendingDecode | None = None

    def choice(self, body: dict[str, Any], request_id: str) -> Exchange:
        """One choice of a fanned-out request: its own body and request id, the request's
        API and trace, not yet routed."""
        return Exchange(self.api, body, request_id, self.trace)
