"""Decoding vLLM's KV events, checked against vLLM's own encoder over generated batches,
the legacy array form, malformed input, and the sequence rules of EventStream."""

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from proxy.routing.kv_events import (
    BadMessage,
    Cleared,
    EventStream,
    Removed,
    Stored,
    decode_event,
    decode_message,
    decode_payload,
)

hashes = st.one_of(st.integers(0, 2**64 - 1), st.binary(min_size=32, max_size=32))


@st.composite
def vllm_events(draw):
    kind = draw(st.sampled_from(["stored", "removed", "cleared"]))
    if kind == "cleared":
        return AllBlocksCleared()
    block_hashes = draw(st.lists(hashes, min_size=1, max_size=4))
    if kind == "removed":
        return BlockRemoved(block_hashes=block_hashes, medium=draw(st.sampled_from(["GPU", "CPU", None])))
    block_size = draw(st.sampled_from([1, 4, 16]))
    tokens = draw(
        st.lists(
            st.integers(0, 200_000), min_size=len(block_hashes) * block_size, max_size=len(block_hashes) * block_size
        )
    )
    return BlockStored(
        block_hashes=block_hashes,
        parent_block_hash=draw(st.one_of(st.none(), hashes)),
        token_ids=tokens,
        block_size=block_size,
        lora_id=None,
        medium="GPU",
        lora_name=draw(st.sampled_from([None, None, "adapter"])),
        group_idx=draw(st.sampled_from([None, 0, 1])),
    )


def expected(event):
    if isinstance(event, AllBlocksCleared):
        return Cleared()
    if isinstance(event, BlockRemoved):
        return Removed(tuple(event.block_hashes))
    special = "lora" if event.lora_name else ("kv_cache_group" if event.group_idx not in (None, 0) else None)
    return Stored(tuple(event.block_hashes), event.parent_block_hash, tuple(event.token_ids), event.block_size, special)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(vllm_events(), max_size=6), st.integers(0, 2**63 - 1), st.one_of(st.none(), st.integers(0, 7)))
def test_decodes_what_vllm_encodes(events, seq, dp_rank):
    payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=1.5, events=events, data_parallel_rank=dp_rank))
    batch = decode_message([b"kv", seq.to_bytes(8, "big"), payload])
    assert batch.seq == seq and batch.malformed == 0
    assert batch.events == [expected(e) for e in events]


def test_legacy_array_events_and_unknown_types():
    legacy = [
        ["BlockStored", [7, 8], None, [1, 2, 3, 4], 2, None, "GPU"],
        ["BlockRemoved", [7], "GPU"],
        ["AllBlocksCleared"],
    ]
    payload = msgspec.msgpack.encode([0.0, [*legacy, {"type": "SomethingNew", "x": 1}]])
    batch = decode_payload(3, payload)
    assert batch.events == [Stored((7, 8), None, (1, 2, 3, 4), 2), Removed((7,)), Cleared()]
    assert batch.malformed == 1  # the unknown type: skipped, counted


@pytest.mark.parametrize(
    "raw",
    [
        {
            "type": "BlockStored",
            "block_hashes": [1],
            "parent_block_hash": None,
            "token_ids": [1, 2, 3],
            "block_size": 2,
        },
        {
            "type": "BlockStored",
            "block_hashes": [1],
            "parent_block_hash": None,
            "token_ids": ["a", "b"],
            "block_size": 2,
        },
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1], "block_size": 0},
        {"type": "BlockRemoved"},
        {"no": "type"},
        "BlockStored",
        [],
    ],
)
def test_malformed_events_are_skipped_one_by_one(raw):
    good = {"type": "AllBlocksCleared"}
    batch = decode_payload(0, msgspec.msgpack.encode([0.0, [raw, good]]))
    assert batch.events == [Cleared()] and batch.malformed == 1
    with pytest.raises((KeyError, IndexError, TypeError, ValueError)):
        if decode_event(raw) is None:
            raise ValueError("unknown")


@pytest.mark.parametrize(
    "frames",
    [
        [b"kv", b"\x00" * 8],
        [b"kv", b"\x00" * 4, b""],
        [b"kv", b"\x00" * 8, b"\xc1"],  # not msgpack
        [b"kv", b"\x00" * 8, msgspec.msgpack.encode({"ts": 1})],
        [b"kv", b"\x00" * 8, msgspec.msgpack.encode([1.0, 5])],
    ],
)
def test_bad_messages(frames):
    with pytest.raises(BadMessage):
        decode_message(frames)


def test_stream_in_order_gap_and_restart():
    stream = EventStream()
    assert [stream.on_batch(s) for s in (0, 1, 2)] == ["apply"] * 3
    assert stream.on_batch(1) == "drop"  # replay overlap while syncing
    stream.synced()
    assert stream.on_batch(3) == "apply"
    assert stream.on_batch(6) == "gap" and stream.last_seq == 3
    stream.skip_to(6)
    assert stream.on_batch(7) == "apply"
    assert stream.on_batch(0) == "restart"  # a new publisher counts from 0 again
    assert stream.on_batch(5) == "restart"  # or from wherever we first hear it
    stream.restart()
    assert stream.on_batch(5) == "apply" and stream.syncing


def test_after_a_gap_replay_the_queued_old_batches_are_not_a_restart():
    stream = EventStream()
    for seq in range(5):
        stream.on_batch(seq)
    stream.synced()
    assert stream.on_batch(8) == "gap"
    stream.begin_replay(5)  # what a replay from 5 does (proxy/routing/kv_subscriber.py)
    for seq in (5, 6, 7, 8):  # the replay
        assert stream.on_batch(seq) == "apply"
    assert [stream.on_batch(seq) for seq in (6, 7, 8)] == ["drop"] * 3  # still queued live from before
    assert stream.on_batch(9) == "apply"
    stream.synced()
    assert stream.on_batch(3) == "restart"
    stream.restart()
    for seq in range(6):
        stream.on_batch(seq)
    stream.begin_replay(4)
    assert stream.on_batch(4) == "drop"  # may be a copy of a replayed batch
    assert stream.on_batch(0) == "restart"  # below the replay's start: a new publisher


def test_a_new_publisher_is_noticed_even_while_syncing():
    stream = EventStream()
    for seq in range(3):
        stream.on_batch(seq)
    verdicts = [stream.on_batch(0) for _ in range(EventStream.MAX_SYNC_DROPS + 1)]
    assert verdicts[-1] == "restart" and set(verdicts[:-1]) == {"drop"}


def test_events_with_odd_hashes_are_malformed_not_fatal():
    odd = [
        {"type": "BlockStored", "block_hashes": [[1]], "parent_block_hash": None, "token_ids": [1], "block_size": 1},
        {"type": "BlockRemoved", "block_hashes": [-5]},
        {"type": "BlockRemoved", "block_hashes": [7], "group_idx": 1},
    ]
    batch = decode_payload(0, msgspec.msgpack.encode([0.0, odd]))
    assert batch.malformed == 2 and batch.events == [Removed(())]
