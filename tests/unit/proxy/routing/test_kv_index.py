"""The KV index against a simple model of the workers' caches: generated store, remove
and clear operations, emitted as a vLLM engine emits them, then every prompt's matched
blocks compared. Plus the bounds, the routing notes and what is skipped."""

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.routing.kv_events import Cleared, Removed, Stored
from proxy.routing.kv_index import KvIndex, block_keys

BS = 4
WORKERS = ["w0", "w1"]
# A few prompts sharing prefixes (so chains branch), 5 blocks each.
BASES = [[1] * 8 + [2] * 12, [1] * 8 + [3] * 12, [4] * 20]


def engine_hash(prefix: tuple) -> int:
    return int.from_bytes(hashlib.sha256(repr(prefix).encode()).digest()[-8:], "big")


class Engine:
    """What a worker's engine holds, and the events it would publish."""

    def __init__(self):
        self.held: set[tuple] = set()  # token prefixes (whole blocks) in the cache

    def store(self, prompt: list[int], blocks: int) -> list:
        # Like vLLM: the blocks after the cached ones, in one event, parent = the last cached one.
        prefixes = [tuple(prompt[: (i + 1) * BS]) for i in range(blocks)]
        first_new = next((i for i, p in enumerate(prefixes) if p not in self.held), None)
        if first_new is None:
            return []
        new = prefixes[first_new:]
        self.held.update(new)
        parent = engine_hash(prefixes[first_new - 1]) if first_new else None
        return [Stored(tuple(engine_hash(p) for p in new), parent, tuple(prompt[first_new * BS : blocks * BS]), BS)]

    def remove(self, pick: int) -> list:
        if not self.held:
            return []
        victim = sorted(self.held)[pick % len(self.held)]
        self.held.discard(victim)
        return [Removed((engine_hash(victim),))]

    def clear(self) -> list:
        self.held.clear()
        return [Cleared()]

    def matched(self, prompt: list[int]) -> int:
        count = 0
        while count * BS + BS <= len(prompt) and tuple(prompt[: (count + 1) * BS]) in self.held:
            count += 1
        return count


operation = st.one_of(
    st.tuples(st.just("store"), st.sampled_from(WORKERS), st.integers(0, len(BASES) - 1), st.integers(1, 5)),
    st.tuples(st.just("remove"), st.sampled_from(WORKERS), st.integers(0, 50), st.just(0)),
    st.tuples(st.just("clear"), st.sampled_from(WORKERS), st.just(0), st.just(0)),
)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.lists(operation, max_size=40))
def test_index_matches_a_model_of_the_caches(operations):
    engines = {w: Engine() for w in WORKERS}
    index = KvIndex()
    for name, worker, a, b in operations:
        engine = engines[worker]
        events = (
            engine.store(BASES[a], b) if name == "store" else engine.remove(a) if name == "remove" else engine.clear()
        )
        index.apply(worker, events)
    for prompt in BASES:
        keys = block_keys(prompt, BS)
        assert index.matched_blocks(keys, WORKERS) == {w: engines[w].matched(prompt) for w in WORKERS}
    assert index.counts.orphans == 0  # every event's parent was seen


def test_keys_chain_whole_prefixes_and_ignore_a_partial_block():
    a, b = block_keys([1, 2, 3, 4, 5, 6, 7], 2), block_keys([9, 9, 3, 4], 2)
    assert len(a) == 3 and a[1] != b[1]  # same block tokens, other prefix: another key
    assert block_keys([1, 2, 3, 4], 2) == a[:2]
    assert block_keys([-1, 2**40], 1) == []  # not what any engine holds


def test_keys_are_pinned():
    """The keys' bytes (little-endian 32-bit ids, chained blake2b): a faster way to build
    them must give these."""
    assert [k.hex() for k in block_keys([1, 2, 3, 4, 5, 6, 7], 2)] == [
        "6cd89ca195a6248d",
        "071781c804d6936d",
        "ef6436fd84a18d73",
    ]
    assert [k.hex() for k in block_keys((151643, 0, 2**31 - 1, 7), 2, parent=bytes(8))] == [
        "b1d18ba7f92fac04",
        "78744e5dc19b882c",
    ]
    assert block_keys([-(2**31), 5], 1)[0].hex() == "58a66297157d8944"
    assert block_keys([1.5, 2], 1) == block_keys(["a"], 1) == block_keys([2**31], 1) == []


def test_orphans_other_block_sizes_and_special_blocks_are_skipped():
    index = KvIndex()
    index.set_block_size("w", 2)
    index.apply("w", [Stored((5,), 999, (1, 2), 2)])  # parent never seen
    index.apply("w", [Stored((6,), None, (1, 2, 3, 4), 4)])  # other block size
    index.apply("w", [Stored((7,), None, (1, 2), 2, special="lora")])
    assert index.counts.orphans == 1 and index.counts.skipped == 2
    assert index.matched_blocks(block_keys([1, 2], 2), ["w"]) == {"w": 0}
    index.set_block_size("w", 4)  # another engine config: what was known is dropped


def test_bounded_oldest_out_and_restored_blocks_move_back():
    index = KvIndex(max_blocks_per_worker=2)
    for h, tokens in ((1, (1, 1)), (2, (2, 2)), (1, (1, 1)), (3, (3, 3))):  # 1 re-stored before 3 arrives
        index.apply("w", [Stored((h,), None, tokens, 2)])
    assert index.size() == {"w": 2} and index.counts.evicted == 1
    held = {t: index.matched_blocks(block_keys(list(t), 2), ["w"])["w"] for t in ((1, 1), (2, 2), (3, 3))}
    assert held == {(1, 1): 1, (2, 2): 0, (3, 3): 1}


def test_routing_notes_last_a_short_while():
    now = [100.0]
    index = KvIndex(routed_ttl_s=2.0, clock=lambda: now[0])
    keys = block_keys(list(range(8)), 2)
    index.note_routed("w", keys[:3])
    assert index.matched_blocks(keys, ["w", "v"]) == {"w": 3, "v": 0}
    now[0] += 2.5
    assert index.matched_blocks(keys, ["w"]) == {"w": 0}


def test_forget_and_cleared():
    index = KvIndex()
    index.apply("w", [Stored((1, 2), None, (1, 1, 2, 2), 2)])
    keys = block_keys([1, 1, 2, 2], 2)
    assert index.matched_blocks(keys, ["w"]) == {"w": 2}
    index.apply("w", [Cleared()])
    assert index.matched_blocks(keys, ["w"]) == {"w": 0} and index.counts.cleared == 1
    index.apply("w", [Stored((1,), None, (1, 1), 2)])
    index.forget("w")
    assert index.size() == {}
