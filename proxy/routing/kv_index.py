"""Which worker's prefix cache holds which prompt blocks, from the workers' KV events.

Keys are the proxy's own: a block's key chains the key of the block before it with the
block's token ids (blake2b, 8 bytes), so a key names a whole prefix, as vLLM's block
hashes do, without depending on the engines' hash function, seed or PYTHONHASHSEED.
A `BlockStored` event carries its blocks' token ids and its parent's engine hash: the
index maps each worker's engine hashes to its own keys, and re-keys the blocks from
their tokens. An event whose parent it never saw (it subscribed late, or lost events)
cannot be re-keyed and is counted and skipped.

Routing asks `matched_blocks(keys)`: per worker, how many of the prompt's leading blocks
it holds. A routing decision is noted at once (`note_routed`) for a short while, so a
burst of requests sharing a prefix does not all miss before the worker's events arrive.

Memory is bounded per worker (`max_blocks_per_worker`, about 230 bytes a block in
CPython; oldest stored first out: vLLM
evicts least recently used blocks, and a re-stored block moves to the back).
`forget(worker)` drops everything of a worker (AllBlocksCleared, a restart, ejection,
leaving the pool).
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from proxy.routing.kv_events import Cleared, Event, Removed, Stored

_SEED = b"pdspec-kv-index-v1"


def block_keys(token_ids: Sequence[int], block_size: int, parent: bytes | None = None) -> list[bytes]:
    """The keys of the full blocks of `token_ids` (a trailing partial block has none);
    none at all for ids that are not 32-bit integers (no engine would hold them)."""
    try:
        # Little-endian 32-bit ids, the same bytes on every machine. struct packs a list
        # of ids in about half the time array("i", ...) takes: the larger part of this
        # function's cost in a route plan (loadtest/micro/routing_cost.py).
        raw = struct.pack(f"<{len(token_ids)}i", *token_ids)
    except struct.error:
        return []
    step = 4 * block_size
    keys = []
    previous = parent if parent is not None else _SEED
    blake2b = hashlib.blake2b
    for start in range(0, len(raw) - step + 1, step):
        digest = blake2b(previous, digest_size=8)
        digest.update(raw[start : start + step])
        previous = digest.digest()
        keys.append(previous)
    return keys


@dataclass
class _WorkerCache:
    by_engine_hash: OrderedDict = field(default_factory=OrderedDict)  # engine hash -> key, oldest first
    holders: dict[bytes, int] = field(default_factory=dict)  # key -> engine hashes naming it
    routed: dict[bytes, float] = field(default_factory=dict)  # key -> until when a routing note holds
    swept_at: float = float("-inf")

    def drop_engine_hash(self, engine_hash) -> None:
        key = self.by_engine_hash.pop(engine_hash, None)
        if key is None:
            return
        left = self.holders[key] - 1
        if left:
            self.holders[key] = left
        else:
            del self.holders[key]


@dataclass
class IndexCounts:
    """What the index did, for the proxy's metrics."""

    stored: int = 0
    removed: int = 0
    cleared: int = 0
    orphans: int = 0  # blocks whose parent the index never saw
    skipped: int = 0  # blocks of another block size, LoRA, multimodal or another KV group
    evicted: int = 0  # dropped to keep within max_blocks_per_worker


class KvIndex:
    def __init__(
        self,
        max_blocks_per_worker: int = 200_000,
        routed_ttl_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_blocks_per_worker = max_blocks_per_worker
        self.routed_ttl_s = routed_ttl_s
        self.clock = clock
        self.counts = IndexCounts()
        self._workers: dict[str, _WorkerCache] = {}
        self.block_sizes: dict[str, int] = {}  # the block size each worker's events must have

    # --- from the workers' events ------------------------------------------------------

    def set_block_size(self, worker: str, block_size: int) -> None:
        if self.block_sizes.get(worker) != block_size:
            self.forget(worker)
            self.block_sizes[worker] = block_size

    def apply(self, worker: str, events: Iterable[Event]) -> None:
        for event in events:
            if isinstance(event, Stored):
                self._stored(worker, event)
            elif isinstance(event, Removed):
                cache = self._workers.get(worker)
                for engine_hash in event.block_hashes:
                    if cache is not None and engine_hash in cache.by_engine_hash:
                        cache.drop_engine_hash(engine_hash)
                        self.counts.removed += 1
            elif isinstance(event, Cleared):
                self.counts.cleared += 1
                self.forget(worker)

    def _stored(self, worker: str, event: Stored) -> None:
        expected = self.block_sizes.get(worker)
        if event.special is not None or (expected is not None and event.block_size != expected):
            self.counts.skipped += len(event.block_hashes)
            return
        cache = self._workers.setdefault(worker, _WorkerCache())
        parent = None
        if event.parent_block_hash is not None:
            parent = cache.by_engine_hash.get(event.parent_block_hash)
            if parent is None:
                self.counts.orphans += len(event.block_hashes)
                return
        keys = block_keys(event.token_ids, event.block_size, parent)
        for engine_hash, key in zip(event.block_hashes, keys):
            if engine_hash in cache.by_engine_hash:
                cache.drop_engine_hash(engine_hash)  # stored again: it moves to the back
            cache.by_engine_hash[engine_hash] = key
            cache.holders[key] = cache.holders.get(key, 0) + 1
            self.counts.stored += 1
        while len(cache.by_engine_hash) > self.max_blocks_per_worker:
            cache.drop_engine_hash(next(iter(cache.by_engine_hash)))
            self.counts.evicted += 1

    def forget(self, worker: str) -> None:
        self._workers.pop(worker, None)

    # --- for routing --------------------------------------------------------------------

    def note_routed(self, worker: str, keys: Sequence[bytes]) -> None:
        """A request with these block keys was just sent to `worker`."""
        cache = self._workers.setdefault(worker, _WorkerCache())
        now = self.clock()
        until = now + self.routed_ttl_s
        if now - cache.swept_at >= max(self.routed_ttl_s, 1.0):  # expired notes go, at most once per TTL
            cache.routed = {k: t for k, t in cache.routed.items() if t > now}
            cache.swept_at = now
        for key in keys:
            cache.routed[key] = until

    def matched_blocks(self, keys: Sequence[bytes], workers: Iterable[str], routed: bool = True) -> dict[str, int]:
        """Per worker, how many leading blocks of the prompt it holds (or, with `routed`,
        was just sent)."""
        now = self.clock()
        matched = {}
        for worker in workers:
            cache = self._workers.get(worker)
            count = 0
            if cache is not None:
                for key in keys:
                    if key in cache.holders or (routed and cache.routed.get(key, 0.0) > now):
                        count += 1
                    else:
                        break
            matched[worker] = count
        return matched

    def size(self) -> dict[str, int]:
        """Blocks held per worker (the index's memory, exported as a gauge)."""
        return {worker: len(cache.by_engine_hash) for worker, cache in self._workers.items()}
