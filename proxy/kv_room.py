"""Admission by KV room on the prefill workers (`prefill_kv_admission`).

A prefill worker keeps a prompt's KV from its prefill until a decode worker has read it.
When the decode workers take KV more slowly than the prefill workers make it (decode
batches full, decode KV full), the prefill workers' KV fills with blocks held for
transfers; vLLM then queues new prefills until blocks free, and a proxy that keeps
sending them sees its prefill legs time out (504) after waiting in a queue it cannot
see. With this on, the proxy sends a prefill leg only to a worker with room for its
prompt and otherwise waits, woken at each reading, up to `queue_timeout_s` (then 503
with Retry-After): a KV bottleneck shows as queueing in the proxy, not as timeouts.

Room is read, not guessed: every `prefill_kv_read_interval_s` the proxy reads each healthy
prefill worker's /metrics: its KV size (`vllm:cache_config_info`: num_gpu_blocks x
block_size, in tokens) and how much is in use (`vllm:kv_cache_usage_perc`, which counts
blocks held for transfers). Between two readings the prompts of the prefill legs sent to
a worker are added to its use, so a burst does not all go to one reading's room. A prompt
fits when use + prompt <= size x `prefill_kv_headroom`; a prompt larger than that goes
when the worker holds nothing, so no prompt waits forever. A worker whose room cannot be
read (no such series: a plain stand-in, a failed read) is not held back: admission only
ever delays a request for a worker known to be full.

Prompt sizes are the route plan's token count when cache-aware routing read the ids, the
ids of a token prompt, else the text's characters over `prompt_chars_per_token`.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import ProxyError
from proxy.pool import WorkerPool
from proxy.upstream import UpstreamClient, UpstreamError
from proxy.worker_info import samples

log = logging.getLogger("pdspec.proxy.kv_room")

CACHE_INFO, USAGE = "vllm:cache_config_info", "vllm:kv_cache_usage_perc"


@dataclass
class Room:
    """One prefill worker's KV, as last read, plus what was sent to it since."""

    size_tokens: int
    used_fraction: float
    sent_tokens: int = 0  # prompts of the prefill legs sent since the reading

    def free_tokens(self, headroom: float) -> float:
        return self.size_tokens * (headroom - self.used_fraction) - self.sent_tokens

    def fits(self, tokens: int, headroom: float) -> bool:
        if tokens > self.size_tokens * headroom:  # never fits: alone, then
            return self.used_fraction == 0 and self.sent_tokens == 0
        return tokens <= self.free_tokens(headroom)


def parse_room(text: str) -> Room | None:
    """A worker's KV size and use from its /metrics text; None without both series (summed
    over data-parallel engines, whose caches are separate)."""
    try:
        size = sum(int(s.labels["num_gpu_blocks"]) * int(s.labels["block_size"]) for s in samples(text, CACHE_INFO))
        used = [s.value for s in samples(text, USAGE)]
    except (KeyError, ValueError):
        return None
    if size <= 0 or not used:
        return None
    return Room(size, min(max(sum(used) / len(used), 0.0), 1.0))


def prompt_tokens(body: dict[str, Any], planned: int | None, chars_per_token: float) -> int:
    """The prompt's size in tokens: exact when known, else estimated from its text."""
    if planned is not None:
        return planned
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return int(len(prompt) / chars_per_token) + 1
    text = {k: body.get(k) for k in ("prompt", "messages", "input", "instructions", "system", "tools")}
    return int(len(orjson.dumps(text)) / chars_per_token) + 1


class KvRoom:
    def __init__(self, client: UpstreamClient, pool: WorkerPool, headroom: float, read_interval_s: float,
                 wait_timeout_s: float, retry_after_s: int, metrics, headers: dict[str, str] | None = None):  # fmt: skip
        self.client = client
        self.pool = pool
        self.headroom = headroom
        self.read_interval_s = read_interval_s
        self.wait_timeout_s = wait_timeout_s
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.headers = headers or {}
        self.rooms: dict[str, Room] = {}
        self.waiting = 0
        self._read = asyncio.Event()  # set (and replaced) after each reading

    def fits(self, url: str, tokens: int) -> bool:
        room = self.rooms.get(url)
        return room is None or room.fits(tokens, self.headroom)

    async def wait_for_room(self, tokens: int) -> set[str]:
        """Waits until a healthy prefill worker has room for `tokens`; returns the URLs of
        those that have none (for the routing to leave out). Raises 503 after the wait
        timeout. Without a healthy worker it returns at once: the prefill leg fails as
        it would without admission."""
        deadline = time.monotonic() + self.wait_timeout_s
        waited = False
        while True:
            healthy = self.pool.healthy()
            full = {w.url for w in healthy if not self.fits(w.url, tokens)}
            if not healthy or len(full) < len(healthy):
                if waited:
                    self.metrics.kv_room_waits.labels("admitted").inc()
                return full
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.metrics.kv_room_waits.labels("timeout").inc()
                raise ProxyError(503, "No prefill worker has KV room for this prompt now; retry later.",
                                 code="overloaded", headers={"Retry-After": str(self.retry_after_s)})  # fmt: skip
            waited = True
            self.waiting += 1
            try:
                await asyncio.wait_for(self._read.wait(), remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                self.waiting -= 1

    def sent(self, url: str, tokens: int) -> None:
        """A prefill leg of `tokens` went to `url`: its room until the next reading."""
        room = self.rooms.get(url)
        if room is not None:
            room.sent_tokens += tokens

    async def read(self) -> None:
        """One reading of every healthy prefill worker; wakes the waiters."""
        workers = self.pool.healthy()
        rooms = await asyncio.gather(*(self._read_one(w.url) for w in workers))
        self.rooms = {w.url: room for w, room in zip(workers, rooms) if room is not None}
        for worker in self.pool.workers:
            room = self.rooms.get(worker.url)
            if room is not None:
                self.metrics.prefill_kv_free_tokens.labels(worker.url).set(max(room.free_tokens(1.0), 0))
        event, self._read = self._read, asyncio.Event()
        event.set()

    async def _read_one(self, url: str) -> Room | None:
        try:
            resp = await self.client.request(url, "GET", "/metrics", headers={"Accept-Encoding": "gzip", **self.headers},
                                             timeout_s=max(self.read_interval_s * 4, 1.0))  # fmt: skip
            body = await resp.read()
            if resp.status != 200:
                return None
            if resp.headers.get("content-encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            return parse_room(body.decode("utf-8", "replace"))
        except (UpstreamError, OSError, EOFError) as exc:
            log.debug("cannot read the KV room of %s: %s", url, exc)
            return None

    async def run(self) -> None:
        while True:
            try:
                await self.read()
            except Exception:  # noqa: BLE001 (admission must never stop reading)
                log.exception("reading the prefill workers' KV room")
            await asyncio.sleep(self.read_interval_s)
