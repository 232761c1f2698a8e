"""The achievable-hit-rate reference: a trace replayed offline against LRU caches of the
fleet's real sizes, under routers that know every cache exactly.

Model of one worker's prefix cache (vLLM's, simplified): `capacity` blocks of
`block_size` tokens; a prompt hits on its leading full blocks that the cache holds (a
chained key per block, `proxy.routing.kv_index.block_keys`, so a block hits only after the same
prefix); after the request, all its full blocks are in the cache as the most recently
used, its head more recent than its tail (vLLM frees a request's blocks tail first, so its
tail is evicted first); the least recently used go when the cache is over capacity.
`drop_last_block`: vLLM with an EAGLE drafter gives up the last block of every hit (it
recomputes it for the drafter's hidden states), so a hit of n blocks saves n - 1.

What it leaves out, and so what the reference is not: requests running side by side
(their blocks cannot be evicted; a burst of one new prefix computes it more than once),
the KV of generated tokens, and timing. Requests are replayed in the trace's order.

Routers (`replay`, `router=`):
- `oracle`: each prompt to the worker holding its longest cached prefix; among equals (a
  new prefix), to the one given the fewest prompts so far (balance), then the lowest index;
- `pinned`: each group (tenant or session) to a worker chosen once, the one with the
  fewest groups so far (a balanced static partition: a router that knows the groups);
- `round_robin`: prompts in turn, for the floor.
`achievable` takes the better of oracle and pinned: what a cache-aware router could hold
on caches of this size. Not a bound (a router that weighs prefixes by use, or refuses
to cache one-off prompts, can do better), but one no LRU cache of this size beats by
routing alone in these simulations.

Failure policy: none needed; pure functions of their inputs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from proxy.routing.kv_index import block_keys

ROUTERS = ("oracle", "pinned", "round_robin")


class LruBlockCache:
    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("a cache holds at least one block")
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    def matched(self, keys: Sequence[bytes]) -> int:
        """The prompt's leading blocks held here."""
        n = 0
        for key in keys:
            if key not in self.blocks:
                break
            n += 1
        return n

    def store(self, keys: Sequence[bytes]) -> None:
        """The request's blocks, most recently used, head last (tail evicted first)."""
        for key in reversed(keys):
            self.blocks[key] = None
            self.blocks.move_to_end(key)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


def replay(
    prompts: Sequence[Sequence[int]],
    block_size: int,
    workers: int,
    capacity_blocks: int,
    router: str = "oracle",
    drop_last_block: bool = False,
    groups: Sequence[int] | None = None,
) -> dict:
    """The hit rate of `prompts`, in order, on `workers` LRU caches of `capacity_blocks`:
    {"hit_rate", "hit_tokens", "prompt_tokens", "router", ...}. `groups`: each prompt's
    tenant or session (needed by `pinned`)."""
    if router not in ROUTERS:
        raise ValueError(f"router {router!r}: one of {', '.join(ROUTERS)}")
    if router == "pinned" and groups is None:
        raise ValueError("the pinned router needs each prompt's group")
    caches = [LruBlockCache(capacity_blocks) for _ in range(workers)]
    given = [0] * workers  # prompts per worker
    owner: dict[int, int] = {}
    owned = [0] * workers  # groups per worker
    hit = total = 0
    for index, prompt in enumerate(prompts):
        total += len(prompt)
        keys = block_keys(list(prompt), block_size)
        if router == "round_robin":
            w = index % workers
        elif router == "pinned":
            group = groups[index]
            if group not in owner:
                owner[group] = owned.index(min(owned))
                owned[owner[group]] += 1
            w = owner[group]
        else:
            w = max(range(workers), key=lambda i: (caches[i].matched(keys), -given[i], -i))
        matched = caches[w].matched(keys)
        hit += block_size * (max(matched - 1, 0) if drop_last_block else matched)
        caches[w].store(keys)
        given[w] += 1
    return {
        "router": router,
        "workers": workers,
        "capacity_blocks": capacity_blocks,
        "block_size": block_size,
        "drop_last_block": drop_last_block,
        "hit_tokens": hit,
        "prompt_tokens": total,
        "hit_rate": hit / total if total else 0.0,
    }


def unbounded_hit_rate(prompts: Sequence[Sequence[int]], block_size: int, drop_last_block: bool = False) -> float:
    """The share of prompt tokens an earlier prompt had, with caches that never evict."""
    seen: set[bytes] = set()
    hit = total = 0
    for prompt in prompts:
        total += len(prompt)
        keys = block_keys(list(prompt), block_size)
        matched = 0
        for key in keys:
            if key not in seen:
                break
            matched += 1
        hit += block_size * (max(matched - 1, 0) if drop_last_block else matched)
        seen.update(keys)
    return hit / total if total else 0.0


def reference(
    prompts: Sequence[Sequence[int]],
    groups: Sequence[int],
    block_size: int,
    capacity_blocks: int,
    workers: Sequence[int],
    measured_from: int = 0,
) -> dict:
    """Every router at each worker count in `workers`, with and without EAGLE's dropped
    block, plus `achievable` (oracle or pinned, the better); hit rates over the prompts
    from index `measured_from` on (the ones before it, a warm-up, fill the caches)."""
    out: dict = {
        "block_size": block_size,
        "capacity_blocks": capacity_blocks,
        "measured_from": measured_from,
        "unbounded": {},
        "by_workers": {},
    }
    for drop in (False, True):
        label = "eagle" if drop else "plain"
        out["unbounded"][label] = _tail_rate(
            prompts, measured_from, lambda p, drop=drop: unbounded_hit_rate(p, block_size, drop), block_size
        )
        for n in workers:
            row = out["by_workers"].setdefault(str(n), {})
            rates = {}
            for router in ROUTERS:
                rates[router] = _measured(prompts, groups, measured_from, block_size, n, capacity_blocks, router, drop)
            rates["achievable"] = max(rates["oracle"], rates["pinned"])
            row[label] = rates
    return out


def _measured(prompts, groups, start, block_size, workers, capacity, router, drop) -> float:
    """The hit rate over prompts[start:], the earlier ones replayed first (warm caches)."""
    if start == 0:
        return replay(prompts, block_size, workers, capacity, router, drop, groups)["hit_rate"]
    whole = replay(prompts, block_size, workers, capacity, router, drop, groups)
    head = replay(prompts[:start], block_size, workers, capacity, router, drop, groups[:start])
    # The replay is deterministic and sequential, so the head's counts are the whole's first part.
    tokens = whole["prompt_tokens"] - head["prompt_tokens"]
    return (whole["hit_tokens"] - head["hit_tokens"]) / tokens if tokens else 0.0


def _tail_rate(prompts, start, rate_of, block_size) -> float:
    if start == 0:
        return rate_of(prompts)
    whole, head = prompts, prompts[:start]
    t_whole = sum(len(p) for p in whole)
    t_head = sum(len(p) for p in head)
    hits = rate_of(whole) * t_whole - rate_of(head) * t_head
    return hits / (t_whole - t_head) if t_whole > t_head else 0.0
