"""The subscriber against vLLM's own ZMQ publisher (vllm.distributed.kv_events): what was
published before it subscribed comes through the replay, live batches follow, a
publisher that starts again (a restarted engine) makes it forget and re-read, and
messages that are not batches are counted and skipped."""

import asyncio
import time

import pytest
import zmq
from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher

from proxy.routing.kv_index import KvIndex, block_keys
from proxy.routing.kv_subscriber import EventSource, Subscriber
from tests.polling import until
from tests.standin import free_port

BS = 4


def stored(block_hash: int, tokens: list[int], parent: int | None = None) -> KVEventBatch:
    event = BlockStored(
        block_hashes=[block_hash],
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    return KVEventBatch(ts=time.time(), events=[event])


@pytest.fixture
def ports():
    return free_port(), free_port()


def publisher(ports) -> ZmqEventPublisher:
    """vLLM's publisher on these ports; the ports of one just shut down are released by
    ZMQ's I/O thread a moment later, so binding is tried until then."""
    pub, replay = ports
    deadline = time.monotonic() + 10
    while True:
        try:
            # "*": vLLM binds (with a host it would connect, as to a proxy of its own).
            return ZmqEventPublisher(
                0, endpoint=f"tcp://*:{pub}", replay_endpoint=f"tcp://127.0.0.1:{replay}", topic="kv"
            )
        except zmq.ZMQError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def held(index: KvIndex, tokens: list[int]) -> int:
    return index.matched_blocks(block_keys(tokens, BS), ["w"])["w"]


async def test_replay_then_live_then_a_restarted_publisher(ports):
    index = KvIndex()
    resets = []
    source = EventSource(f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}", "kv")
    subscriber = Subscriber(
        "w", source, lambda w, b: index.apply(w, b.events), lambda w: (resets.append(w), index.forget(w))
    )
    first = publisher(ports)
    first.publish(stored(1, [1, 1, 1, 1]))  # before anyone subscribed
    first.publish(stored(2, [2, 2, 2, 2], parent=1))
    task = asyncio.ensure_future(subscriber.run())
    try:
        await until(lambda: held(index, [1] * 4 + [2] * 4) == 2, timeout_s=10)
        assert subscriber.counts.replays >= 1 and subscriber.counts.batches == 2
        first.publish(stored(3, [3, 3, 3, 3], parent=2))  # live
        await until(lambda: held(index, [1] * 4 + [2] * 4 + [3] * 4) == 3, timeout_s=10)
        assert subscriber.stream.last_seq == 2
        first.shutdown()

        second = publisher(ports)  # the engine restarted in place: seq starts at 0 again
        try:
            # The SUB socket reconnects by itself, a moment later: a busy engine publishes
            # on, and the first batch heard gives the restart away.
            deadline = time.monotonic() + 10
            while held(index, [9] * 4) == 0:
                assert time.monotonic() < deadline
                second.publish(stored(9, [9, 9, 9, 9]))
                await asyncio.sleep(0.05)
            assert resets == ["w"] and subscriber.counts.restarts == 1
            assert held(index, [1] * 4) == 0  # the old engine's blocks are gone with it
        finally:
            second.shutdown()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_messages_that_are_not_batches_are_counted_and_skipped(ports):
    index = KvIndex()
    context = zmq.Context.instance()
    pub = context.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{ports[0]}")
    source = EventSource(f"tcp://127.0.0.1:{ports[0]}", None, "kv")
    subscriber = Subscriber("w", source, lambda w, b: index.apply(w, b.events), index.forget)
    task = asyncio.ensure_future(subscriber.run())
    good = KvIndexPayload.good()
    try:
        # A SUB socket joins a little after connect(): send until the first good batch lands.
        deadline = time.monotonic() + 10
        seq = 0
        while held(index, [5] * 4) == 0:
            assert time.monotonic() < deadline
            pub.send_multipart([b"kv", b"\x00", b"short seq"])
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), b"\xc1 not msgpack"])
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), good])
            seq += 1
            await asyncio.sleep(0.05)
        assert subscriber.counts.bad_messages >= 2 and not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pub.close(0)


class KvIndexPayload:
    @staticmethod
    def good() -> bytes:
        import msgspec

        return msgspec.msgpack.Encoder().encode(stored(5, [5, 5, 5, 5]))


def test_event_source_from_worker_info():
    info = {"kv_events_endpoint": "tcp://*:5650", "kv_events_replay_endpoint": "tcp://*:5651", "kv_events_topic": "kv"}
    assert EventSource.from_info(info, "10.0.0.7") == EventSource("tcp://10.0.0.7:5650", "tcp://10.0.0.7:5651", "kv")
    assert EventSource.from_info(info, "fd00::1").endpoint == "tcp://[fd00::1]:5650"
    assert (
        EventSource.from_info({**info, "kv_events_endpoint": "tcp://10.1.1.1:6000"}, "h").endpoint
        == "tcp://10.1.1.1:6000"
    )
    assert EventSource.from_info({"kv_events_endpoint": ""}, "h") is None
    assert EventSource.from_info(None, "h") is None


async def test_a_cancelled_subscriber_stops_even_mid_replay(ports):
    index = KvIndex()
    source = EventSource(f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}", "kv")
    subscriber = Subscriber("w", source, lambda w, b: index.apply(w, b.events), index.forget)
    pub = publisher(ports)
    try:
        for i in range(3000):  # a long replay buffer
            pub.publish(stored(i + 1, [i % 50] * BS))
        task = asyncio.ensure_future(subscriber.run())
        await until(lambda: subscriber.counts.batches >= 50, timeout_s=10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        stopped_at = subscriber.counts.batches
        assert stopped_at < 3000
        for _ in range(20):
            await asyncio.sleep(0.01)  # the loop runs on: nothing more arrives from the cancelled task
        assert subscriber.counts.batches == stopped_at
    finally:
        pub.shutdown()
