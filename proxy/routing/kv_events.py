"""vLLM's KV-cache events, as the proxy reads them: decoding, and the order they come in.

Wire format (vllm/distributed/kv_events.py): each ZMQ message is three frames, `topic`,
`seq` (8 bytes, big-endian) and a msgpack payload: the batch `[ts, events, dp_rank]`.
An event is a map tagged by `"type"` (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`)
since vLLM's 2026 change; before it, a positional array whose first item is the tag.
Both are accepted. Each event is decoded on its own: an unknown type or a malformed
event is counted and skipped, never fails the batch (vLLM's own advice to consumers).

Ordering (`EventStream`): `seq` counts batches from 0 in each publisher process, so a
worker's engine that restarts starts again at 0. A gap means batches were lost (the
PUB socket drops past its high-water mark): the caller replays from the missing seq.
Once in sync, any live seq at or below the last one applied means a new publisher: the
caller forgets the worker's blocks and replays from 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

END_OF_REPLAY = b"\xff" * 8  # vLLM's replay end marker (seq -1)


@dataclass(frozen=True, slots=True)
class Stored:
    """Full blocks the engine committed to its prefix cache, in order."""

    block_hashes: tuple  # the engine's hashes (int, or bytes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
    parent_block_hash: Any  # the block before the first one, None at the start of a sequence
    token_ids: tuple[int, ...]
    block_size: int
    # Set when the blocks are not plain full-attention blocks of the base model: such
    # blocks are not what a text prompt would hit, and are not indexed.
    special: str | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    block_hashes: tuple


@dataclass(frozen=True, slots=True)
class Cleared:
    """The engine dropped its whole prefix cache."""


Event = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class Batch:
    seq: int
    events: list[Event]
    malformed: int  # events that could not be read (skipped)
    ts: float = 0.0  # when the engine published it (its clock)


class BadMessage(Exception):
    """A message that is not a KV event batch at all."""


def decode_message(frames: list[bytes]) -> Batch:
    """One live or replayed message: [topic, seq, payload] (a replay's DEALER frames
    without their empty delimiter)."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise BadMessage(f"expected [topic, seq, payload], got {len(frames)} frames")
    seq = int.from_bytes(frames[1], "big")
    return decode_payload(seq, frames[2])


def decode_payload(seq: int, payload: bytes) -> Batch:
    import msgspec

    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise BadMessage(f"not msgpack: {exc}") from None
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], (list, tuple)):
        raise BadMessage("a batch is [ts, events, ...]")
    events: list[Event] = []
    malformed = 0
    for raw in batch[1]:
        try:
            event = decode_event(raw)
        except (KeyError, IndexError, TypeError, ValueError):
            event = None
        if event is None:
            malformed += 1
        else:
            events.append(event)
    ts = batch[0] if isinstance(batch[0], (int, float)) else 0.0
    return Batch(seq, events, malformed, float(ts))


# Positional fields of the array form, after the tag (vLLM before the tagged maps).
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def decode_event(raw: Any) -> Event | None:
    """One event from its map or array form; None for an unknown type."""
    if isinstance(raw, dict):
        kind, fields = raw["type"], raw
    elif isinstance(raw, (list, tuple)) and raw:
        kind = raw[0]
        names = _ARRAY_FIELDS.get(kind, ())
        fields = dict(zip(names, raw[1:]))
    else:
        raise TypeError("an event is a map or an array")
    if kind == "BlockStored":
        hashes, tokens, block_size = tuple(fields["block_hashes"]), tuple(fields["token_ids"]), fields["block_size"]
        if type(block_size) is not int or block_size <= 0 or not all(type(t) is int for t in tokens):
            raise ValueError("bad BlockStored")
        if len(tokens) != len(hashes) * block_size:
            raise ValueError("token_ids do not fill the blocks")
        if not all(_is_hash(h) for h in hashes) or not (
            fields.get("parent_block_hash") is None or _is_hash(fields["parent_block_hash"])
        ):
            raise ValueError("block hashes are integers or bytes")
        return Stored(hashes, fields.get("parent_block_hash"), tokens, block_size, _special(fields))
    if kind == "BlockRemoved":
        hashes = tuple(fields["block_hashes"])
        if not all(_is_hash(h) for h in hashes):
            raise ValueError("block hashes are integers or bytes")
        if fields.get("group_idx") not in (None, 0):
            return Removed(())  # another KV group's blocks: never indexed
        return Removed(hashes)
    if kind == "AllBlocksCleared":
        return Cleared()
    return None


def _is_hash(value: Any) -> bool:
    return (type(value) is int and value >= 0) or type(value) is bytes


def _special(fields: dict) -> str | None:
    if fields.get("lora_name") or fields.get("lora_id"):
        return "lora"
    if any(key is not None for key in fields.get("extra_keys") or ()):
        return "extra_keys"  # multimodal inputs or a cache salt: other hashes for the same tokens
    if fields.get("group_idx") not in (None, 0):
        return "kv_cache_group"
    if fields.get("kv_cache_spec_sliding_window") is not None:
        return "sliding_window"  # a sliding-window layer's blocks do not make a prefix hit
    return None


class EventStream:
    """Where one worker's event sequence stands. Pure: the subscriber feeds it seqs and
    does what it answers."""

    APPLY, DROP, GAP, RESTART = "apply", "drop", "gap", "restart"

    # Old seqs dropped while syncing before they are taken for a new publisher after all
    # (more than a SUB socket's default queue of 1,000 could hold from before a replay).
    MAX_SYNC_DROPS = 2000

    def __init__(self) -> None:
        self.last_seq: int | None = None  # the last batch applied
        self.syncing = True  # replaying: older or repeated seqs are expected and dropped
        self._sync_drops = 0
        self._replayed_from = 0  # seqs from here on may come twice (replayed, and queued live)

    def on_batch(self, seq: int) -> str:
        if self.last_seq is None or seq == self.last_seq + 1:
            self.last_seq = seq
            return self.APPLY
        if seq <= self.last_seq:
            if self.syncing and seq >= self._replayed_from and self._sync_drops < self.MAX_SYNC_DROPS:
                self._sync_drops += 1
                return self.DROP
            return self.RESTART
        return self.GAP  # the caller replays from last_seq + 1, then calls synced()

    def begin_replay(self, start: int) -> None:
        """A replay from `start` begins: until the next batch in order comes live, a seq
        from `start` on may be a live copy of a replayed one; one below it cannot be."""
        self.syncing, self._replayed_from = True, start

    def skip_to(self, seq: int) -> None:
        """Accept `seq` after a gap that cannot be filled (the engine's replay buffer no
        longer holds the missing batches): what they stored is lost to the index."""
        self.last_seq = seq

    def synced(self) -> None:
        """The next batch in order came live: from now on an old seq means a new publisher."""
        self.syncing, self._sync_drops = False, 0

    def restart(self) -> None:
        self.last_seq, self.syncing, self._sync_drops, self._replayed_from = None, True, 0, 0
