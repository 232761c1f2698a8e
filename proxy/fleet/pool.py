"""Worker pools: the prefill and the decode workers, each with its state as the proxy sees it
(health, pairing, legs in flight and the load they lease), and on the decode pool the prompt
tokens of the disaggregated requests whose decode leg has not started (`decode_pending_tokens`,
leased as a `PendingDecode`).

Which worker of a pool serves a leg is its routing policy's choice (proxy/routing/policy.py,
one module per policy under proxy/routing/policies/), built for the pool by the registry
(proxy/routing/registry.py) and handed in: the fleet names no policy. Only healthy workers
that the pairing check admitted are candidates (see `health.py` and `pairing.py`);
membership can change at run time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

CHURN_HALF_LIFE_S = 30.0  # kv_aware: how fast a worker's recent cache churn is forgotten


class NoHealthyWorker(Exception):
    def __init__(self, pool: str):
        super().__init__(f"no healthy {pool} worker")
        self.pool = pool


@dataclass(eq=False)
class Worker:
    url: str
    healthy: bool = True
    outstanding: int = 0
    # kv_aware: uncached prompt tokens of the prefill legs in flight (and of the requests served whole
    # there, decode_full, until their first token), or prompt tokens the decode legs hold.
    pending_tokens: int = 0
    # Conditional disaggregation, on a decode worker: the prompt tokens it is prefilling itself
    # for legs without KV (local prefills), leased until their first token (a non-streamed reply's
    # whole reply: vLLM sends its headers at the end), or the leg's end; its queue of prefill work.
    local_prefill_tokens: int = 0
    # Conditional disaggregation: the prompt tokens its legs in flight hold in its KV cache by the
    # proxy's own count (every decode leg, and every prefill leg while it runs), which the
    # decode_full rule (proxy/routing/plan.py) weighs against `kv_tokens`. Not kv_aware's load.
    kv_held_tokens: int = 0
    # Its KV cache size in tokens, read with its pdspec_worker_info (None: unknown, never judged full).
    kv_tokens: int | None = None
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    seen_healthy: bool = True  # False for a member that has not yet passed a health check
    # Pairing (pairing.py): its pdspec_worker_info labels (None: none exported or not read
    # yet), when they were read (None: to be read at the next good check), and whether
    # its config may be paired with the other pool's (False: refused, or not read yet).
    admitted: bool = True
    info: dict[str, str] | None = None
    info_read_at: float | None = None
    info_error: str | None = None
    refusal: dict | None = None  # why it is not admitted (for /ready and the logs)
    features_off: dict[str, str] = field(default_factory=dict)  # its engine features that are off, and why
    # Where its pushed KV comes from, by its last prefill reply (proxy/flow/early_decode.py); None: unknown.
    kv_source: dict | None = None
    # Prompt tokens its prefill legs computed lately (kv_aware's cache churn), halving every CHURN_HALF_LIFE_S.
    churn: DecayingSum = field(default_factory=lambda: DecayingSum(CHURN_HALF_LIFE_S))
    host: str = field(init=False)

    def __post_init__(self) -> None:
        self.host = urlsplit(self.url).hostname or ""

    def lease(
        self, tokens: int = 0, computed: bool = True, prefilling: int = 0, held: int = 0, computing: int = 0
    ) -> Lease:
        """One leg open on this worker (what `least_outstanding` routing counts), until the
        lease is released: use it as a context manager, or hand it on (a decode stream's
        lease lives as long as the stream) and call `release()`, which is idempotent.
        `tokens`: kv_aware's load, the prompt tokens the leg makes the worker prefill
        (`computed`: they count as cache churn too) or, for a decode leg, the prompt
        tokens it holds in the worker's KV cache (not `computed`). `prefilling`: for a
        decode leg without KV, the prompt tokens the worker prefills for it
        (`local_prefill_tokens`), held until `prefilled()` (the relay's first byte after the
        preamble: the first token of a stream, the end of a non-streamed reply, which so counts
        as prefilling for longer and makes the queue rule fire less) or the release. `held`:
        the prompt tokens the leg holds in the worker's KV cache (`kv_held_tokens`, conditional
        disaggregation's count), until the release. `computing`: for a request served whole on
        a prefill worker (decode_full), the prompt tokens it computes there: prefill work in
        `pending_tokens` (the prefill pool's kv_aware load) and churn, but only until
        `prefilled()`, since it then decodes and puts no prefill work ahead of others."""
        self.outstanding += 1
        self.pending_tokens += tokens + computing
        self.local_prefill_tokens += prefilling
        self.kv_held_tokens += held
        churned = (tokens if computed else 0) + computing
        if churned:
            self.churn.add(churned)
        return Lease(self, tokens, prefilling, held, computing)


class DecayingSum:
    """A running sum whose every part halves each `half_life_s`."""

    __slots__ = ("half_life_s", "clock", "_value", "_at")

    def __init__(self, half_life_s: float, clock=time.monotonic) -> None:
        self.half_life_s, self.clock = half_life_s, clock
        self._value, self._at = 0.0, 0.0

    def add(self, amount: float) -> None:
        now = self.clock()
        self._value = self._decayed(now) + amount
        self._at = now

    def value(self) -> float:
        return self._decayed(self.clock())

    def _decayed(self, now: float) -> float:
        return self._value * 0.5 ** ((now - self._at) / self.half_life_s) if self._value else 0.0


class Lease:
    __slots__ = ("worker", "tokens", "prefilling", "held", "computing")

    def __init__(self, worker: Worker, tokens: int = 0, prefilling: int = 0, held: int = 0, computing: int = 0) -> None:
        self.worker: Worker | None = worker
        self.tokens = tokens
        self.prefilling = prefilling
        self.held = held
        self.computing = computing

    def prefilled(self) -> None:
        """The worker has prefilled the leg's prompt (its first token came): its
        `prefilling` and `computing` tokens are no longer ahead of anything. Idempotent."""
        if self.worker is not None:
            self.worker.local_prefill_tokens -= self.prefilling
            self.worker.pending_tokens -= self.computing
        self.prefilling = self.computing = 0

    def release(self) -> None:
        if self.worker is not None:
            self.prefilled()
            self.worker.outstanding -= 1
            self.worker.pending_tokens -= self.tokens
            self.worker.kv_held_tokens -= self.held
            self.worker = None

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class PendingDecode:
    """A disaggregated request's prompt tokens counted in its decode pool's
    `decode_pending_tokens` from its route plan until its decode leg holds them on a decode
    worker (`Worker.kv_held_tokens`), or the request ends without one: `release()`, which
    is idempotent, so the flow may call it at the decode leg's lease and again when the
    request ends, whatever path it took."""

    __slots__ = ("pool", "tokens")

    def __init__(self, pool: WorkerPool, tokens: int) -> None:
        self.pool: WorkerPool | None = pool
        self.tokens = tokens

    def release(self) -> None:
        if self.pool is not None:
            self.pool.decode_pending_tokens -= self.tokens
            self.pool = None

    def __enter__(self) -> PendingDecode:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass
class WorkerPool:
    name: str
    workers: list[Worker]
    # Its routing policy (proxy/routing/policy.py's `Policy`), built by the registry; None
    # for a pool nothing is picked from.
    policy: Any = None
    # Conditional disaggregation, on the decode pool: the prompt tokens of the requests
    # planned disaggregated whose decode leg has not yet leased its worker's KV (their
    # prefill legs run): KV the pool will be asked for about a prefill leg from now, which
    # no worker's `kv_held_tokens` counts yet. decode_full reads it with
    # `routing.decode_full_counts_pending` (proxy/routing/plan.py's `decode_full_on`).
    decode_pending_tokens: int = 0

    def __hash__(self) -> int:  # pools are identities (dict keys), not values
        return id(self)

    @classmethod
    def from_urls(cls, name: str, urls: list[str], policy: Any = None) -> WorkerPool:
        return cls(name, [Worker(url.rstrip("/")) for url in urls], policy)

    def pend_decode(self, tokens: int) -> PendingDecode:
        """`tokens` counted in `decode_pending_tokens` until the lease is released."""
        self.decode_pending_tokens += tokens
        return PendingDecode(self, tokens)

    def healthy(self, exclude: set[str] = frozenset()) -> list[Worker]:
        return [w for w in self.workers if w.healthy and w.admitted and w.url not in exclude]

    def has_healthy(self) -> bool:
        return any(w.healthy and w.admitted for w in self.workers)

    def set_urls(self, urls: list[str]) -> None:
        """Membership change (start-up, DNS re-resolution): known workers keep their
        state; new ones take traffic only after their first good health check."""
        known = {w.url: w for w in self.workers}
        self.workers = [
            known.get(url.rstrip("/")) or Worker(url.rstrip("/"), healthy=False, seen_healthy=False, admitted=False)
            for url in urls
        ]

    def pick(
        self,
        affinity_key: str | None = None,
        exclude: set[str] = frozenset(),
        cached: dict[str, int] | None = None,
        building: dict[str, int] | None = None,
        prompt_tokens: int = 0,
    ) -> Worker:
        """A healthy, admitted worker not in `exclude`, by the pool's policy. `cached`:
        prompt tokens each worker holds (kv_aware; absent: none), `building`: of those, the
        ones a leg in flight there is computing, `prompt_tokens`: the prompt's length."""
        candidates = self.healthy(exclude)
        if not candidates:
            raise NoHealthyWorker(self.name)
        return self.policy.pick(candidates, affinity_key, cached or {}, building or {}, prompt_tokens)
