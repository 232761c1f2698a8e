"""Client API keys (Bearer), checked by the proxy. Workers get their own credential."""

from __future__ import annotations

import hmac

from proxy.errors import ProxyError


class ApiKeys:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [k.encode() for k in keys if k]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, authorization: str | None) -> None:
        if not self.enabled:
            return
        # The scheme is case-insensitive (RFC 9110, 11.1), as vLLM's own key check takes it.
        scheme, space, given_key = (authorization or "").partition(" ")
        if not space or scheme.lower() != "bearer":
            raise ProxyError(401, "Missing API key: send 'Authorization: Bearer <key>'.", code="invalid_api_key")
        given = given_key.strip().encode()
        # Compare against every key in constant time: timing tells nothing of a key's bytes.
        if not any(hmac.compare_digest(given, key) for key in self._keys):
            raise ProxyError(401, "Invalid API key.", code="invalid_api_key")


def worker_auth_headers(worker_api_key: str | None) -> dict[str, str]:
    """What the proxy sends workers: their own key (never a client's), or nothing."""
    return {"Authorization": f"Bearer {worker_api_key}"} if worker_api_key else {}
