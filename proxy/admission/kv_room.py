"""Admission by KV room on the prefill workers (`admission.prefill_kv`).

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
blocks held for transfers). To that reading's use it adds the prompts of the prefill legs
in flight on the worker and of those answered since the reading began (the next reading
sees their blocks), so a burst does not all go to one reading's room. A prompt fits when
use + prompt <= size x `prefill_kv_headroom`; a prompt larger than that goes when the
worker holds nothing. A worker whose room cannot be read (no
such series: a plain stand-in, a failed read) is not held back: admission only ever
delays a request for a worker known to be full.

Queued prefill time: KV room is not the only thing a prefill leg waits for inside a
worker. When prompts come faster than the worker prefills them (one GPU shared by both
workers, measured on the H200: 29 requests waiting, KV 2% used, every leg past the 20-s
`prefill_timeout_s` a 504), vLLM's queue grows with the KV nearly empty and the legs at its
back time out. So a worker also has room only while the prompt tokens in flight there,
this prompt's included, take at most `queue_budget_s` at the worker's measured rate
(proxy/admission/prefill_rate.py; by default half of `prefill_timeout_s`, so an admitted leg ends
well inside its timeout). Until a worker's first leg is answered its rate is unknown and it
takes one leg at a time; a prompt larger than the budget goes when the worker has none in
flight. The proxy's own legs are all it counts: another client, or another proxy replica,
sending prefills to the same worker is not seen (its effect shows in the measured rate).

Waiting: requests wait in the order they began to, a newcomer behind them (a long prompt
that needs an emptier worker is not overtaken by shorter ones for ever); they look again
at each reading and each leg's end. A retry of a failed leg waits for room again. The wait
is bounded by `queue_timeout_s`: under a load the workers never drain, it ends in a 503.

Prompt sizes: the route plan's token count when cache-aware routing read the ids, the ids
of a token prompt, else the text's characters over a characters-per-token ratio that
starts at `prompt_chars_per_token` and follows the prefill replies' own counts (their
`usage`), which also replace the estimate of an answered leg.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from pdspec.settings import AdmissionSettings
from proxy.admission.prefill_rate import PrefillRate
from proxy.errors import ProxyError
from proxy.fleet.pool import WorkerPool
from proxy.fleet.worker_info import InfoUnreadable, fetch_metrics_text, parse_kv_tokens, samples
from proxy.upstream.client import UpstreamClient

log = logging.getLogger("pdspec.proxy.kv_room")

USAGE = "vllm:kv_cache_usage_perc"


@dataclass
class Room:
    """One prefill worker's KV at a reading: its size in tokens and the share in use."""

    size_tokens: int
    used_fraction: float

    def fits(self, tokens: int, pending_tokens: int, headroom: float) -> bool:
        """Whether a prompt of `tokens` fits beside the reading's use and `pending_tokens`
        (prompts sent to the worker that the reading may not show)."""
        if tokens > self.size_tokens * headroom:  # never fits: alone, then
            return self.used_fraction == 0 and pending_tokens == 0
        return tokens <= self.free_tokens(headroom) - pending_tokens

    def free_tokens(self, headroom: float) -> float:
        return self.size_tokens * (headroom - self.used_fraction)


def parse_room(text: str) -> Room | None:
    """A worker's KV size and use from its /metrics text; None without both series (summed
    over data-parallel engines, whose caches are separate)."""
    size = parse_kv_tokens(text)
    try:
        used = [s.value for s in samples(text, USAGE)]
    except ValueError:
        return None
    if size is None or not used:
        return None
    return Room(size, min(max(sum(used) / len(used), 0.0), 1.0))


def prompt_size(body: dict[str, Any]) -> tuple[int | None, int]:
    """(the prompt's token count when the body has token ids, its size in characters)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt), 0
    if isinstance(prompt, str):
        return None, len(prompt)
    text = {k: body.get(k) for k in ("prompt", "messages", "input", "instructions", "system", "tools")}
    return None, len(orjson.dumps(text))


def reply_prompt_tokens(reply: Any) -> int | None:
    """The prompt's tokens as a prefill reply counts them (completions and chat:
    usage.prompt_tokens; Responses and Messages: input tokens, cache reads included)."""
    usage = reply.get("usage") if isinstance(reply, dict) else None
    if not isinstance(usage, dict):
        return None
    if isinstance(usage.get("prompt_tokens"), int):
        return usage["prompt_tokens"]
    if isinstance(usage.get("input_tokens"), int):
        cache_reads = usage.get("cache_read_input_tokens")
        return usage["input_tokens"] + (cache_reads if isinstance(cache_reads, int) else 0)
    return None


@dataclass
class Leg:
    """One prefill leg as admission counts it (see `KvRoom.begin` and `KvRoom.end`)."""

    url: str
    tokens: int  # as estimated when it was sent
    chars: int  # the prompt's characters (0: its tokens were known)


class KvRoom:
    CALIBRATION_WEIGHT = 0.2  # of each prefill reply in the characters-per-token ratio

    def __init__(
        self,
        client: UpstreamClient,
        pool: WorkerPool,
        headroom: float,
        read_interval_s: float,
        wait_timeout_s: float,
        retry_after_s: int,
        metrics,
        chars_per_token: float = 2.0,
        headers: dict[str, str] | None = None,
        queue_budget_s: float | None = None,
    ):
        """`queue_budget_s`: the most prefill time queued on one worker (None or 0: no time check)."""
        self.client = client
        self.pool = pool
        self.headroom = headroom
        self.read_interval_s = read_interval_s
        self.wait_timeout_s = wait_timeout_s
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.chars_per_token = chars_per_token
        self.headers = headers or {}
        self.rooms: dict[str, Room] = {}
        self.inflight: dict[str, int] = {}  # prompt tokens of the prefill legs in flight, per worker
        self.answered: dict[str, int] = {}  # prompt tokens of the legs answered, ever, per worker
        self.answered_at_reading: dict[str, int] = {}  # `answered` when the last reading began
        self.queue_budget_s = queue_budget_s or None
        self.rates: dict[str, PrefillRate] = {}
        self._line: deque[object] = deque()  # the requests waiting for room, oldest first
        self._timed: set[str] = set()  # workers whose rate and queued time are exported
        self._read = asyncio.Event()  # set (and replaced) after each reading and each leg's end

    @classmethod
    def from_settings(
        cls,
        client: UpstreamClient,
        pool: WorkerPool,
        settings: AdmissionSettings,
        metrics,
        headers: dict[str, str] | None = None,
        queue_budget_s: float | None = None,
    ) -> KvRoom:
        """The KV room check the `admission` group describes (its queue's wait and Retry-After
        too). `queue_budget_s`: the budget in force (ProxySettings.queue_budget(), which
        defaults it from the prefill legs' timeout, a `worker_client` setting)."""
        return cls(
            client,
            pool,
            settings.prefill_kv_headroom,
            settings.prefill_kv_read_interval_s,
            settings.queue_timeout_s,
            settings.retry_after_s,
            metrics,
            settings.prompt_chars_per_token,
            headers,
            queue_budget_s,
        )

    def tokens_of(self, body: dict[str, Any], planned: int | None) -> tuple[int, int]:
        """(the prompt's tokens, exact or estimated; its characters, 0 when exact)."""
        if planned is not None:
            return planned, 0
        exact, chars = prompt_size(body)
        if exact is not None:
            return exact, 0
        return int(chars / self.chars_per_token) + 1, chars

    def pending(self, url: str) -> int:
        return self.inflight.get(url, 0) + self.answered.get(url, 0) - self.answered_at_reading.get(url, 0)

    def fits(self, url: str, tokens: int) -> bool:
        room = self.rooms.get(url)
        kv_fits = room is None or room.fits(tokens, self.pending(url), self.headroom)
        return kv_fits and self.time_fits(url, tokens)

    def time_fits(self, url: str, tokens: int) -> bool:
        """Whether the worker would prefill the prompts in flight there and this one within
        the budget (always, with no leg in flight: a prompt over the budget goes alone)."""
        in_flight = self.inflight.get(url, 0)
        if self.queue_budget_s is None or in_flight <= 0:
            return True
        rate = self.rates.get(url)
        queued = rate.queued_s(in_flight + tokens) if rate is not None else None
        return queued is not None and queued <= self.queue_budget_s  # no rate yet: one leg at a time

    def queued_s(self, url: str) -> float | None:
        """The prefill time of the prompts in flight on `url`, at its measured rate."""
        rate = self.rates.get(url)
        return rate.queued_s(self.inflight.get(url, 0)) if rate is not None else None

    async def wait_for_room(self, tokens: int) -> set[str]:
        """Waits until a healthy prefill worker has room for `tokens`; returns the URLs of
        those that have none (for the routing to leave out). Raises 503 after the wait
        timeout. Without a healthy worker it returns at once: the prefill leg fails as
        it would without admission. Waiters go in the order they began waiting, and a
        newcomer waits behind them: a prompt that needs an emptier worker (a long one) is
        not overtaken for ever by shorter ones that fit sooner."""
        deadline = time.monotonic() + self.wait_timeout_s
        ticket: object | None = None  # our place in the line, once we wait
        try:
            while True:
                healthy = self.pool.healthy()
                full = {w.url for w in healthy if not self.fits(w.url, tokens)}
                our_turn = not self._line or self._line[0] is ticket
                if not healthy or (our_turn and len(full) < len(healthy)):
                    if ticket is not None:
                        self.metrics.kv_room_waits.labels("admitted").inc()
                    return full
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.metrics.kv_room_waits.labels("timeout").inc()
                    raise ProxyError(
                        503,
                        "No prefill worker has room (KV room, or queued prefill time) for this "
                        "prompt now; retry later.",
                        code="overloaded",
                        headers={"Retry-After": str(self.retry_after_s)},
                    )
                if ticket is None:
                    ticket = object()
                    self._line.append(ticket)
                try:
                    await asyncio.wait_for(self._read.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        finally:  # admitted, timed out, or the client left: the next in line looks again
            if ticket is not None:
                self._line.remove(ticket)
                self._wake()

    def begin(self, url: str, tokens: int, chars: int) -> Leg:
        """A prefill leg of `tokens` goes to `url`."""
        self.inflight[url] = self.inflight.get(url, 0) + tokens
        self.rates.setdefault(url, PrefillRate()).started(time.monotonic())
        return Leg(url, tokens, chars)

    def end(self, leg: Leg, reply_tokens: int | None, cached_tokens: int | None = None, charged: bool = True) -> None:
        """The leg is over; `reply_tokens`: the prompt's tokens as its reply counted them
        (None: it failed, and holds no KV there); `cached_tokens`: those of them the worker
        served from its prefix cache; `charged`: whether its time says how fast the worker
        is (False for a leg cut short when its client left, or that the worker refused)."""
        self.inflight[leg.url] = self.inflight.get(leg.url, 0) - leg.tokens
        computed = None if reply_tokens is None else max(reply_tokens - (cached_tokens or 0), 0)
        self.rates[leg.url].ended(time.monotonic(), computed, charged)  # begin() made it; kept while in flight
        self._wake()  # its time in the queue is room now
        if reply_tokens is None:
            return
        self.answered[leg.url] = self.answered.get(leg.url, 0) + reply_tokens
        if leg.chars and reply_tokens > 0:
            observed = leg.chars / reply_tokens
            self.chars_per_token += self.CALIBRATION_WEIGHT * (observed - self.chars_per_token)

    async def read(self) -> None:
        """One reading of every healthy prefill worker; wakes the waiters."""
        workers = self.pool.healthy()
        marks = {w.url: self.answered.get(w.url, 0) for w in workers}
        rooms = await asyncio.gather(*(self._read_one(w.url) for w in workers))
        shown, self.rooms = self.rooms.keys(), {w.url: room for w, room in zip(workers, rooms) if room is not None}
        for url, room in self.rooms.items():
            self.answered_at_reading[url] = marks[url]
            self.metrics.prefill_kv_free_tokens.labels(url).set(max(room.free_tokens(1.0) - self.pending(url), 0))
        for url in shown - self.rooms.keys():  # ejected, gone or unreadable: no stale room shown
            self.metrics.remove_series(self.metrics.prefill_kv_free_tokens, url)
        for worker in workers:
            rate = self.rates.get(worker.url)
            if rate is not None and rate.tokens_per_s:
                self.metrics.prefill_rate.labels(worker.url).set(rate.tokens_per_s)
                self.metrics.prefill_queued_seconds.labels(worker.url).set(self.queued_s(worker.url) or 0.0)
                self._timed.add(worker.url)
        members = {w.url for w in self.pool.workers}
        for url in [u for u, rate in self.rates.items() if u not in members and not rate.legs_in_flight]:
            del self.rates[url]  # left the pool (dns:// membership): nothing kept per worker that is gone
            for counts in (self.inflight, self.answered, self.answered_at_reading):
                counts.pop(url, None)
        for url in self._timed - {w.url for w in workers}:  # ejected or gone: no stale reading left
            self._timed.discard(url)
            self.metrics.remove_series(self.metrics.prefill_rate, url)
            self.metrics.remove_series(self.metrics.prefill_queued_seconds, url)
        self._wake()

    def _wake(self) -> None:
        """Wakes the requests waiting for room, to look again."""
        event, self._read = self._read, asyncio.Event()
        event.set()

    async def _read_one(self, url: str) -> Room | None:
        try:
            text = await fetch_metrics_text(self.client, url, max(self.read_interval_s * 4, 1.0), self.headers)
        except InfoUnreadable as exc:
            log.debug("cannot read the KV room of %s: %s", url, exc)
            return None
        return parse_room(text) if text is not None else None

    async def run(self) -> None:
        while True:
            try:
                await self.read()
            except Exception:  # noqa: BLE001 (admission must never stop reading)
                log.exception("reading the prefill workers' KV room")
            await asyncio.sleep(self.read_interval_s)
