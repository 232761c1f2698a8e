"""How a worker leg ends when it does not end in the reply the flow wanted: one exception
family, which the flow (proxy/flow/disagg.py), early decode and the KV release read by type.

- `PassThrough`: the worker answered a status the client should see as is (a 4xx: the
  request's fault, so no other worker is tried);
- `LegFailed`: the leg failed in a way another worker might not (a 5xx, a connection error,
  a timeout, a reply that is not what a P/D leg returns);
- `DecodeFailed`: every decode attempt failed; a ProxyError, so the client gets the last
  one's status.

Each carries `reason`, a bounded label value (`http_503`, `timeout`, `no_kv_params`, ...),
which the metrics count by class (`status_class`).
"""

from __future__ import annotations

import asyncio

from proxy.asgi import Reply
from proxy.errors import ProxyError


class LegOutcome(Exception):
    """A leg that did not end in the reply the flow wanted; `reason`: why, as a label value."""

    reason: str


class PassThrough(LegOutcome):
    """A worker answered with a status the client should see as is (a 4xx)."""

    reason = "http_4xx"

    def __init__(self, reply: Reply):
        super().__init__(f"worker replied {reply.status}")
        self.reply = reply


class LegFailed(LegOutcome):
    """A leg failed in a way another worker might not (5xx, connection, timeout)."""

    def __init__(self, status: int, message: str, reason: str):
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


class DecodeFailed(ProxyError, LegOutcome):
    """Every decode attempt failed; `reason` is the last one's (for the release count)."""

    def __init__(self, failure: LegFailed) -> None:
        super().__init__(failure.status, failure.message)
        self.reason = failure.reason


def release_reason(exc: BaseException) -> str:
    """Why a prefill's KV is being released, as a bounded label value."""
    if isinstance(exc, asyncio.CancelledError):
        return "client_gone"
    return status_class(exc.reason if isinstance(exc, LegOutcome) else "proxy_error")


def status_class(reason: str) -> str:
    """`http_503` -> `http_5xx`: one label value per class, not per status."""
    return reason[:6] + "xx" if reason.startswith("http_") and len(reason) == 8 else reason
