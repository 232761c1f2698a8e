"""Cache-aware routing (`kv_aware` policies, conditional disaggregation): the index of
the workers' caches, the subscriptions that fill it, and a request's route plan.

- `sync()` runs after every health round: it subscribes to the KV events of each healthy,
  admitted worker that publishes them (its pdspec_worker_info says where), and drops the
  subscription and forgets the worker's blocks when the worker is ejected, refused or
  leaves, or publishes elsewhere (another process). A restart in place is caught by the
  subscription itself (the event sequence starts again).
- `plan()` reads the prompt's token ids: given in the body; computed in the proxy with
  `routing.tokenizer` (proxy/routing/local_tokenizer.py: a text prompt or a plain chat,
  once proxy/routing/tokenizer_check.py found it agrees with a decode worker's); else
  from a decode worker (proxy/routing/tokens.py: `/tokenize` for completions and chat,
  the API's render endpoint for Responses and Messages). It keys its
  full blocks as the index does, and gives each pool's cached tokens per worker and the
  prompt's rendezvous keys (its ids' start for prefix_affinity; for kv_aware's tie-break,
  its first block no worker holds, `new_part_key`). With conditional
  disaggregation a decode worker is chosen first, and a prompt whose part uncached on that
  worker is short, or whose wait for the prefill pool (`prefill_work_ahead`) is longer
  than for that worker's own prefills, is prefilled there (proxy/routing/plan.py's
  `local_prefill`: no prefill leg, no KV transfer); else, when no decode worker has KV
  room for the prompt and a prefill worker has, that prefill worker serves it whole
  (`decode_full_on`, reason `decode_full`; with `decode_full_counts_pending`, the room
  less the prompts planned disaggregated whose decode legs have not started, the decode
  pool's `decode_pending_tokens`, which the flow leases: proxy/flow/disagg.py).
- `routed()` notes a routing decision in the index for a short while.

Failure policy: nothing here fails a request. Without token ids or a known block size a
request is routed as if nothing were cached (load and the rendezvous hash of the body's
prompt, `keys.affinity_key`), and always disaggregated; a subscription that ends is
started again at the next sync. A `routing.tokenizer` that cannot be loaded stops the
proxy at start-up (TokenizerLoadError, from the constructor).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pdspec.settings import RoutingSettings
from proxy.fleet.pool import Worker, WorkerPool
from proxy.metrics import ProxyMetrics
from proxy.routing.keys import new_part_key, rendezvous_key, token_affinity_key
from proxy.routing.kv_index import KvIndex, block_keys
from proxy.routing.kv_subscriber import EventSource, Subscriber
from proxy.routing.local_tokenizer import LocalTokenizer
from proxy.routing.plan import RoutePlan, decode_full_on, local_prefill
from proxy.routing.policies.kv_aware import work_ahead
from proxy.routing.tokenizer_check import TokenizerCheck
from proxy.routing.tokens import direct_token_ids, prompt_token_ids, rendered_token_ids
from proxy.upstream.client import UpstreamClient

log = logging.getLogger("pdspec.proxy.routing")


class Rendered(Protocol):
    """What the route plan needs of an API (proxy/apis/api.py's `Api`): where its prompt's
    token ids come from (proxy/routing/tokens.py)."""

    chat: bool
    render_path: str | None
    render_body: Callable[[dict[str, Any]], dict[str, Any]] | None


@dataclass
class _Subscription:
    source: EventSource
    subscriber: Subscriber
    task: asyncio.Task


class KvRouter:
    def __init__(
        self,
        settings: RoutingSettings,
        client: UpstreamClient,
        prefill_pool: WorkerPool,
        decode_pool: WorkerPool,
        metrics: ProxyMetrics,
        worker_headers: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.prefill_pool, self.decode_pool = prefill_pool, decode_pool
        self.metrics = metrics
        self.worker_headers = worker_headers or {}
        self.index = KvIndex(settings.kv_index_max_blocks, settings.kv_routed_ttl_s)
        self.subscriptions: dict[str, _Subscription] = {}
        self._counted: dict[str, int] = {}  # what the metrics have of the index's counts
        self._retired: dict[str, int] = {}  # counts of subscriptions that ended
        self.tokenizer = LocalTokenizer.load(settings.tokenizer) if settings.tokenizer is not None else None
        self.tokenizer_check = (
            TokenizerCheck(
                self.tokenizer,
                self._worker_tokenize,
                lambda kind, agreed: metrics.tokenizer_agrees.labels(kind).set(agreed),
            )
            if self.tokenizer is not None
            else None
        )

    @staticmethod
    def wanted(settings: RoutingSettings) -> bool:
        return (
            "kv_aware" in (settings.prefill_policy, settings.decode_policy) or settings.disaggregation == "conditional"
        )

    # --- subscriptions -----------------------------------------------------------------

    def sync(self) -> None:
        sources: dict[str, tuple[Worker, EventSource]] = {}
        for pool in (self.prefill_pool, self.decode_pool):
            for worker in pool.workers:
                source = EventSource.from_info(worker.info, worker.host) if worker.healthy and worker.admitted else None
                if source is not None:
                    sources[worker.url] = (worker, source)
        for url, subscription in list(self.subscriptions.items()):
            if url not in sources or sources[url][1] != subscription.source or subscription.task.done():
                self._unsubscribe(url)
        for url, (worker, source) in sources.items():
            if url not in self.subscriptions:
                block_size = _int((worker.info or {}).get("block_size"))
                if block_size:
                    self.index.set_block_size(url, block_size)
                self._subscribe(url, source)
        self._export()
        tokenizer_worker = next(iter(self.decode_pool.healthy()), None)
        if self.tokenizer_check is not None and tokenizer_worker is not None:
            self.tokenizer_check.start(tokenizer_worker.url)

    def _subscribe(self, url: str, source: EventSource) -> None:
        # A cancelled subscriber may still be finishing a step: only the current one of
        # a worker writes to the index.
        def apply(worker: str, batch) -> None:
            if self.subscriptions.get(worker) is not None and self.subscriptions[worker].subscriber is subscriber:
                self.index.apply(worker, batch.events)

        def reset(worker: str) -> None:
            if self.subscriptions.get(worker) is not None and self.subscriptions[worker].subscriber is subscriber:
                self.index.forget(worker)

        subscriber = Subscriber(url, source, apply, reset)
        task = asyncio.ensure_future(subscriber.run())
        task.add_done_callback(lambda t, url=url: _log_end(url, t))
        self.subscriptions[url] = _Subscription(source, subscriber, task)
        log.info("reading the KV events of %s from %s", url, source.endpoint)

    def _unsubscribe(self, url: str) -> None:
        subscription = self.subscriptions.pop(url)
        subscription.task.cancel()
        for name, value in vars(subscription.subscriber.counts).items():  # its counts stay in the totals
            self._retired[name] = self._retired.get(name, 0) + value
        self.index.forget(url)
        self.metrics.remove_series(self.metrics.kv_index_blocks, url)
        self.metrics.remove_series(self.metrics.kv_event_lag, url)

    async def close(self) -> None:
        for url in list(self.subscriptions):
            self._unsubscribe(url)
        if self.tokenizer_check is not None:
            await self.tokenizer_check.close()
        if self.tokenizer is not None:
            self.tokenizer.close()

    def _export(self) -> None:
        counts = dict(vars(self.index.counts))
        subscribers = [dict(self._retired)] + [vars(s.subscriber.counts) for s in self.subscriptions.values()]
        for sub in subscribers:
            for name in ("malformed_events", "bad_messages", "lost_batches", "replays", "restarts"):
                counts[name] = counts.get(name, 0) + sub.get(name, 0)
        for kind, total in counts.items():
            delta = total - self._counted.get(kind, 0)
            if delta > 0:
                self.metrics.kv_events.labels(kind).inc(delta)
            self._counted[kind] = max(total, self._counted.get(kind, 0))
        # A subscribed worker the index forgot (AllBlocksCleared, its engine's restart) is at
        # 0, not at its last size: size() no longer names it.
        sizes = self.index.size()
        for url in sizes.keys() | self.subscriptions.keys():
            self.metrics.kv_index_blocks.labels(url).set(sizes.get(url, 0))
        for url, subscription in self.subscriptions.items():
            self.metrics.kv_event_lag.labels(url).set(subscription.subscriber.lag_s)

    # --- a request's route ---------------------------------------------------------------

    async def plan(self, body: dict[str, Any], api: Rendered) -> RoutePlan | None:
        block_size = self._block_size()
        asked = next(iter(self.decode_pool.healthy()), None)  # the worker asked for ids, if need be
        if block_size is None or asked is None:
            return None
        ids, source = await self.token_ids(body, api, asked.url)
        self.metrics.prompt_token_ids.labels(source).inc()
        if ids is None:
            self.metrics.routing_decisions.labels("any", "no_token_ids").inc()
            return None
        return self.plan_for(ids, block_size)

    async def token_ids(self, body: dict[str, Any], api: Rendered, worker_url: str) -> tuple[list[int] | None, str]:
        """The prompt's ids and where they came from (`given`, `proxy`, `worker`, `none`)."""
        if api.render_path is not None and api.render_body is not None:
            ids = await rendered_token_ids(
                self.client,
                worker_url,
                api.render_path,
                api.render_body(body),
                self.settings.tokenize_timeout_s,
                self.worker_headers,
            )
            return ids, "worker" if ids is not None else "none"
        ids = direct_token_ids(body, api.chat)
        if ids is not None:
            return ids, "given"
        if self._tokenizes_here(api.chat):
            ids = await self.tokenizer.prompt_ids(body, api.chat)
            if ids is not None:
                return ids, "proxy"
        ids = await self._worker_tokenize(worker_url, body, api.chat)
        return ids, "worker" if ids is not None else "none"

    def _tokenizes_here(self, chat: bool) -> bool:
        """Whether the proxy's own tokenizer agreed with a worker's on this kind of prompt."""
        check = self.tokenizer_check
        return check is not None and bool(check.agreement.chat if chat else check.agreement.text)

    async def _worker_tokenize(self, worker_url: str, body: dict[str, Any], chat: bool) -> list[int] | None:
        timeout_s = self.settings.tokenize_timeout_s
        return await prompt_token_ids(self.client, worker_url, body, chat, timeout_s, self.worker_headers)

    def plan_for(self, ids: list[int], block_size: int) -> RoutePlan | None:
        """The route plan of a prompt of these ids: what each pool's workers hold of it, the
        decode worker, the rendezvous keys, the P/D decision (None: no healthy decode worker)."""
        keys = block_keys(ids, block_size)
        prefill_cached = self.cached_tokens(keys, block_size, self.prefill_pool)
        decode_cached = self.cached_tokens(keys, block_size, self.decode_pool)
        affinity = token_affinity_key(ids)
        new_part = new_part_key(ids, keys, block_size, prefill_cached, decode_cached)
        if not self.decode_pool.has_healthy():  # the decode leg will say so
            return None
        decode_worker = None
        if self.settings.disaggregation == "conditional":
            # Its decision is about one decode worker. Otherwise the decode leg picks its
            # worker at its hand-off (proxy/flow/disagg.py): a pick here would only take a
            # policy's turn (round_robin) or a random draw. A healthy worker is there (above).
            decode_worker = self.decode_pool.pick(
                affinity_key=rendezvous_key(self.decode_pool.policy, affinity, new_part), cached=decode_cached
            )
        building = None
        if self.prefill_pool.policy.cache_aware:
            prefill_held = self.cached_tokens(keys, block_size, self.prefill_pool, routed=False)
            building = {
                url: tokens - prefill_held.get(url, 0)
                for url, tokens in prefill_cached.items()
                if tokens > prefill_held.get(url, 0)
            }
        local, decode_uncached, whole_on = None, None, None
        if self.settings.disaggregation == "conditional":
            # What the worker's events say it holds, not routing notes: a burst of one new
            # prompt is noted on the worker before its KV is there.
            held = self.cached_tokens(keys, block_size, self.decode_pool, routed=False).get(decode_worker.url, 0)
            held = min(held, len(ids))
            decode_uncached = len(ids) - held
            max_tokens = self.settings.local_prefill_max_tokens
            # The length rule first (a prompt the decode worker holds, or a short one, stays
            # there); then decode_full, before the queue rule: with every decode worker full,
            # a prompt prefilled on one waits there for KV room, and the requests a prefill
            # worker serves whole count as its legs in flight, which the queue rule would read
            # as a prefill queue (found in review: two whole requests a prefill worker turned
            # every decode_full into a prefill_queue on a full decode worker).
            local = local_prefill(len(ids), held, max_tokens)
            if local is None and self.settings.decode_on_prefill_when_full:
                # With decode_full_counts_pending, the decode pool's room less the prompts
                # planned disaggregated whose decode legs have not started (their prefill legs
                # run): a burst would otherwise be planned on the room of before it. The flow
                # counts this request there too if it is disaggregated (proxy/flow/disagg.py).
                pending = self.decode_pool.decode_pending_tokens if self.settings.decode_full_counts_pending else 0
                whole_on = decode_full_on(
                    len(ids),
                    self.decode_pool.healthy(),
                    self.prefill_pool.healthy(),
                    self.settings.decode_full_share,
                    pending,
                    self.settings.decode_full_prefill_share,
                )
                local = "decode_full" if whole_on is not None else None
            # Only a cache-aware prefill pool (kv_aware) leases its legs' uncached tokens:
            # elsewhere its queue is unknown, and the queue rule stays off.
            if local is None and self.settings.local_prefill_on_queue and self.prefill_pool.policy.cache_aware:
                prefill_ahead = self.prefill_work_ahead(len(ids), prefill_cached, building)
                local = local_prefill(len(ids), held, max_tokens, prefill_ahead, decode_worker.local_prefill_tokens)
        return RoutePlan(
            keys,
            len(ids),
            prefill_cached if self.prefill_pool.policy.cache_aware else None,
            decode_cached if self.decode_pool.policy.cache_aware else None,
            decode_worker=decode_worker,
            affinity=affinity,
            new_part=new_part,
            local_prefill=local,
            prefill_building=building,
            decode_uncached=decode_uncached,
            whole_on=whole_on,
        )

    def prefill_work_ahead(self, prompt_tokens: int, cached: dict[str, int], building: dict[str, int]) -> int | None:
        """The prefill pool's work ahead of a prompt, in prompt tokens to prefill, as kv_aware
        counts a worker's (proxy/routing/policies/kv_aware.py): the least, over its healthy
        workers, of the part of the prompt it lacks (`cached`, routing notes included), plus
        the uncached tokens its prefill legs in flight lease (`pending_tokens`, less those
        `building` this prompt's blocks), plus `kv_aware_load_tokens` per leg in flight; plus
        one more `kv_aware_load_tokens`, the hand-off's fixed cost. Only meaningful where the
        prefill legs lease their uncached tokens, which they do on a cache-aware pool (kv_aware;
        the plan has no `prefill_cached` otherwise, and `uncached_tokens` leases 0): the caller
        asks only then.

        None (no queue to weigh; the P/D decision is the other rule's): a healthy prefill
        worker has no leg in flight, so the prompt would start at once there, and the
        hand-off's cost alone is no reason to prefill on a decode worker (its decodes would
        pay for it; that is what disaggregation avoids), whatever `local_prefill_max_tokens`
        is; or there is no healthy prefill worker (the prefill leg's failure policy decides)."""
        workers = self.prefill_pool.healthy()
        if not workers or any(w.outstanding == 0 for w in workers):
            return None
        load = self.settings.kv_aware_load_tokens
        return load + min(max(0, prompt_tokens - cached.get(w.url, 0)) + work_ahead(w, building, load) for w in workers)

    def cached_tokens(
        self, keys: list[bytes], block_size: int, pool: WorkerPool, routed: bool = True
    ) -> dict[str, int]:
        matched = self.index.matched_blocks(keys, [w.url for w in pool.healthy()], routed=routed)
        return {url: blocks * block_size for url, blocks in matched.items()}

    def routed(self, pool: WorkerPool, worker: Worker, plan: RoutePlan | None) -> None:
        if plan is None:
            return
        cached = (plan.prefill_cached if pool is self.prefill_pool else plan.decode_cached) or {}
        hit = cached.get(worker.url, 0)
        self.metrics.routing_decisions.labels(pool.name, "cache_hit" if hit else "no_cache_hit").inc()
        if hit:
            self.metrics.predicted_hit_tokens.labels(pool.name, worker.url).inc(hit)
        self.index.note_routed(worker.url, plan.keys)

    def _block_size(self) -> int | None:
        for pool in (self.decode_pool, self.prefill_pool):
            for worker in pool.healthy():
                size = _int((worker.info or {}).get("block_size"))
                if size:
                    return size
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _log_end(url: str, task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning(
            "KV events of %s: subscription ended (%s); started again at the next health round", url, task.exception()
        )
