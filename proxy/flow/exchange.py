"""One client request on its way through P/D, as every step of the flow sees it: its API,
its body, its request id, its trace and, once it is routed, its route plan. Built by the
endpoint (proxy/edge/endpoint.py) and handed from step to step instead of the five values; a
fanned-out request (proxy/flow/fanout.py) makes one per choice (`choice`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.apis.api import Api
from proxy.routing.plan import RoutePlan
from proxy.tracing import NO_TRACE, NoTrace


@dataclass(slots=True)
class Exchange:
    api: Api
    body: dict[str, Any]
    request_id: str
    trace: NoTrace = NO_TRACE
    plan: RoutePlan | None = None  # cache-aware routing's plan, set when it routed the request

    def choice(self, body: dict[str, Any], request_id: str) -> Exchange:
        """One choice of a fanned-out request: its own body and request id, the request's
        API and trace, not yet routed."""
        return Exchange(self.api, body, request_id, self.trace)
