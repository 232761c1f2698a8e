"""Worker pools and routing: which prefill and which decode worker serves a request.

Prefill and decode workers are chosen independently. Policies:
- `round_robin`: in turn;
- `least_outstanding`: power of two choices on in-flight requests (cheap and close to
  the true least-loaded worker, without herding every request onto one worker);
- `prefix_affinity` (prefill only): rendezvous hashing of the prompt's first bytes, so
  requests sharing a prefix land on the worker whose prefix cache holds it; falls back
  to least outstanding when that worker is much busier than the rest;
- `kv_aware`: the worker with the least prefill work ahead of the prompt: the prompt
  tokens its prefix cache lacks (the proxy's index of the workers' KV events,
  proxy/routing/kv_router.py), plus the uncached prompt tokens of the prefill legs it is
  already running (`Worker.pending_tokens`), plus `load_tokens` for each leg in flight
  (a leg's fixed cost). On the decode pool `pending_tokens` are the prompt tokens its
  decode legs hold in its KV cache (a decode worker takes a new leg at once only while
  it has room; a leg it holds the prompt of saves only part of a transfer), each leg's
  whole prompt, though legs sharing a prefix hold its blocks once (a busy holder of a
  shared prefix looks busier than it is). Pending tokens that build this prompt's own
  blocks (a burst's first leg, still computing the prefix the others were routed after)
  are not counted: the prompt would wait for them, or compute them again elsewhere. On
  the prefill pool, the prompt's uncached tokens also cost `churn_weight` times the
  worker's share of the pool's recent cache churn (the uncached tokens its prefill legs
  computed, halving every CHURN_HALF_LIFE_S), times the pool's size: storing new blocks
  evicts the least recently used ones, and those are younger, so worth more, on a worker
  that stored more lately. A hit stores little and barely pays; a miss goes to the worker
  whose cache it disturbs least, so new prefixes spread instead of all following a short
  prefix (a system prompt) that one worker holds. Two side effects, measured with as
  they are: at an even share the term is `churn_weight * uncached`, so cached tokens
  weigh 1 + churn_weight against load; and its largest difference grows with the pool's
  size (n times the uncached tokens). Ties go to the less loaded worker, then to the
  prompt's rendezvous hash (its first block no worker holds; with nothing cached
  anywhere, prefix affinity among the least loaded). The same guard as prefix_affinity
  keeps a hot prefix from piling onto one worker.
Only healthy workers that the pairing check admitted are chosen (see `health.py` and
`pairing.py`); membership can change at run time.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pdspec.contract import RoutingPolicy

Policy = RoutingPolicy

AFFINITY_PREFIX_CHARS = 256
AFFINITY_PREFIX_TOKENS = 64  # about AFFINITY_PREFIX_CHARS of text
AFFINITY_MAX_EXTRA_LOAD = 4  # leave the preferred worker when it has this many more in flight
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
    # kv_aware: uncached prompt tokens of the prefill legs in flight, or prompt tokens the decode legs hold.
    pending_tokens: int = 0
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

    def lease(self, tokens: int = 0, computed: bool = True) -> Lease:
        """One leg open on this worker (what `least_outstanding` routing counts), until the
        lease is released: use it as a context manager, or hand it on (a decode stream's
        lease lives as long as the stream) and call `release()`, which is idempotent.
        `tokens`: kv_aware's load, the prompt tokens the leg makes the worker prefill
        (`computed`: they count as cache churn too) or, for a decode leg, the prompt
        tokens it holds in the worker's KV cache (not `computed`)."""
        self.outstanding += 1
        self.pending_tokens += tokens
        if tokens and computed:
            self.churn.add(tokens)
        return Lease(self, tokens)


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
    __slots__ = ("worker", "tokens")

    def __init__(self, worker: Worker, tokens: int = 0) -> None:
        self.worker: Worker | None = worker
        self.tokens = tokens

    def release(self) -> None:
        if self.worker is not None:
            self.worker.outstanding -= 1
            self.worker.pending_tokens -= self.tokens
            self.worker = None

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass
class WorkerPool:
    name: str
    workers: list[Worker]
    policy: Policy = "round_robin"
    load_tokens: int = 256  # kv_aware: what one leg in flight costs, in prompt tokens to prefill
    churn_weight: float = 0.0  # kv_aware: what storing an uncached token costs, at an even share of churn
    _counter: itertools.count = field(default_factory=itertools.count, repr=False)
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    def __hash__(self) -> int:  # pools are identities (dict keys), not values
        return id(self)

    @classmethod
    def from_urls(cls, name: str, urls: list[str], policy: Policy = "round_robin") -> WorkerPool:
        return cls(name, [Worker(url.rstrip("/")) for url in urls], policy)

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
        self, affinity_key: str | None = None, exclude: set[str] = frozenset(), cached: dict[str, int] | None = None,
        building: dict[str, int] | None = None, prompt_tokens: int = 0,
    ) -> Worker:
        """`cached`: prompt tokens each worker holds (kv_aware; absent: none), `building`: of
        those, the ones a leg in flight there is computing, `prompt_tokens`: the prompt's
        length. kv_aware compares `cached - max(0, pending_tokens - building) -
        load_tokens * outstanding - churn_weight * uncached * n * churn share`: without the
        churn term the same order as least work ahead, since the prompt's length is the
        same on every worker."""
        candidates = self.healthy(exclude)
        if not candidates:
            raise NoHealthyWorker(self.name)
        if self.policy == "round_robin":
            return candidates[next(self._counter) % len(candidates)]
        if self.policy == "kv_aware":
            return self._kv_aware(candidates, cached or {}, building or {}, affinity_key or "", prompt_tokens)
        least = self._power_of_two(candidates)
        if self.policy == "prefix_affinity" and affinity_key:
            preferred = max(candidates, key=lambda w: _rendezvous(affinity_key, w.url))
            if preferred.outstanding - least.outstanding < AFFINITY_MAX_EXTRA_LOAD:
                return preferred
        return least

    def _kv_aware(
        self, candidates: list[Worker], cached: dict[str, int], building: dict[str, int], key: str, prompt_tokens: int
    ) -> Worker:
        churn = {w.url: w.churn.value() for w in candidates}
        total = sum(churn.values())

        def score(w: Worker) -> tuple:
            work_ahead = max(0, w.pending_tokens - building.get(w.url, 0)) + self.load_tokens * w.outstanding
            # n * share is 1 at an even share (and while nothing has churned).
            pressure = len(candidates) * churn[w.url] / total if total else 1.0
            stored = max(0, prompt_tokens - cached.get(w.url, 0))
            return (cached.get(w.url, 0) - work_ahead - self.churn_weight * stored * pressure, -w.outstanding,
                    _rendezvous(key, w.url))  # fmt: skip

        best = max(candidates, key=score)
        least = min(candidates, key=lambda w: w.outstanding)
        return best if best.outstanding - least.outstanding < AFFINITY_MAX_EXTRA_LOAD else least

    def _power_of_two(self, candidates: list[Worker]) -> Worker:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(candidates, 2)
        return a if a.outstanding <= b.outstanding else b


def _rendezvous(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{url}|{key}".encode(), digest_size=8).digest(), "big")


def affinity_key(body: dict) -> str | None:
    """The start of the prompt (or of the rendered chat) as a routing key."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt[:AFFINITY_PREFIX_CHARS]
    if isinstance(prompt, list) and prompt:
        return repr(prompt[0] if isinstance(prompt[0], list) else prompt)[:AFFINITY_PREFIX_CHARS]
    messages = body.get("messages")
    if isinstance(messages, list):
        return repr(messages)[:AFFINITY_PREFIX_CHARS]
    responses_input = body.get("input")  # the Responses API: rendered after its `instructions`
    if isinstance(responses_input, (str, list)):
        return repr((body.get("instructions"), responses_input))[:AFFINITY_PREFIX_CHARS]
    return None


def token_affinity_key(ids: list[int]) -> str:
    """The start of the prompt's token ids as a routing key (cache-aware routing, which
    reads them): the same for two requests whose prompts render alike, whatever API they
    came through."""
    return repr(ids[:AFFINITY_PREFIX_TOKENS])
