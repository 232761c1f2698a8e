"""Context limits of the served models, so a request the decode worker would refuse is
refused before its prefill leg: otherwise the prefill worker keeps the prompt's KV for a
decode that never comes."""

from __future__ import annotations

import json

from proxy.errors import ProxyError
from proxy.fleet.pool import WorkerPool
from proxy.upstream.client import UpstreamClient, UpstreamError

LIMITED_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens")  # completions and chat


class ModelLimits:
    def __init__(self, client: UpstreamClient, pool: WorkerPool, headers: dict[str, str]) -> None:
        self.client = client
        self.pool = pool
        self.headers = headers
        self.max_model_len: dict[str, int] = {}
        self.known = False  # a worker answered (it may list no limits)

    async def fetch(self) -> None:
        """max_model_len per served model, from a decode worker's /v1/models (vLLM lists it)."""
        for worker in self.pool.healthy():
            try:
                resp = await self.client.request(worker.url, "GET", "/v1/models", headers=self.headers, timeout_s=5)
                cards = json.loads(await resp.read()).get("data", [])
                self.max_model_len = {c["id"]: int(c["max_model_len"]) for c in cards if c.get("max_model_len")}
                self.known = True
                return
            except (UpstreamError, ValueError, KeyError, TypeError, AttributeError):
                continue

    async def check(self, body: dict, fields: tuple[str, ...] = LIMITED_FIELDS) -> None:
        """`fields` of `body` (the API's: proxy/apis/api.py) may not exceed the model's context:
        vLLM refuses a value above `max_model_len` and caps one up to it at what the prompt
        leaves, so a value equal to the context is served."""
        if not self.known:  # no worker was up when the proxy started
            await self.fetch()
        max_len = self.max_model_len.get(body.get("model"))
        if max_len is None:
            return
        for field in fields:
            value = body.get(field)
            if isinstance(value, int) and value > max_len:
                raise ProxyError(
                    400, f"'{field}' is {value}, but the model's context is {max_len} tokens.", param=field
                )
