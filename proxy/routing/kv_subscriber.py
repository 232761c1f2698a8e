"""One worker's KV-event subscription: a ZMQ SUB socket on its publisher, and its replay
endpoint (a DEALER socket: vLLM answers a replay with many messages, which a REQ socket
would drop after the first).

On start it replays from seq 0 (the engine's buffer of recent batches), so blocks stored
before the proxy subscribed are known too, then applies live batches in order
(`kv_events.EventStream`): after a gap it replays the missing batches; when the engine's
sequence starts again (the worker restarted in place) it forgets the worker's blocks and
replays from 0; so it does when the publisher's connection drops and comes back (caught
with a socket monitor: a restarted engine's first batches may be lost to the reconnecting
socket, and its seqs could then pass for the old one's). A message that is not a batch, or a batch with malformed events, is
counted and skipped. The task runs until cancelled (the worker left, or was ejected);
a replay that gets no answer within `replay_timeout_s` is given up (the index then
knows only what arrives live).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.routing.kv_events import END_OF_REPLAY, BadMessage, Batch, EventStream, decode_message

log = logging.getLogger("pdspec.proxy.kv_events")

CATCH_UP_AFTER_MS = 500
YIELD_EVERY = 64  # live messages handled before the event loop gets a turn


@dataclass(frozen=True)
class EventSource:
    """Where a worker publishes its KV events (its pdspec_worker_info labels, with the
    worker's own host for a wildcard bind)."""

    endpoint: str
    replay_endpoint: str | None
    topic: str

    @classmethod
    def from_info(cls, info: dict[str, str] | None, host: str) -> EventSource | None:
        if not info or not info.get("kv_events_endpoint"):
            return None

        def reachable(endpoint: str) -> str:
            scheme, _, rest = endpoint.partition("://")
            bound, _, port = rest.rpartition(":")
            if bound in ("*", "0.0.0.0", "::", "[::]", ""):
                bound = f"[{host}]" if ":" in host else host
            return f"{scheme}://{bound}:{port}"

        replay = info.get("kv_events_replay_endpoint") or None
        return cls(
            reachable(info["kv_events_endpoint"]),
            reachable(replay) if replay else None,
            info.get("kv_events_topic", ""),
        )


@dataclass
class SubscriberCounts:
    batches: int = 0
    bad_messages: int = 0
    malformed_events: int = 0
    replays: int = 0
    restarts: int = 0
    lost_batches: int = 0  # a gap no replay could fill


@dataclass
class Subscriber:
    worker: str
    source: EventSource
    on_batch: Callable[[str, Batch], None]  # apply a batch's events to the index
    on_reset: Callable[[str], None]  # forget the worker's blocks
    replay_timeout_s: float = 2.0
    counts: SubscriberCounts = field(default_factory=SubscriberCounts)
    lag_s: float = 0.0  # how old the last applied batch was when it arrived
    stream: EventStream = field(default_factory=EventStream)
    replay_failed: bool = False

    async def run(self) -> None:
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.IPV6, 1)  # a worker host may be an IPv6 address
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        sub.connect(self.source.endpoint)
        try:
            await self._replay(context, 0)
            # A SUB socket's subscription reaches the publisher a moment after connect():
            # batches published meanwhile are lost to it, and an idle engine would not
            # publish the next one that reveals the gap. So, if nothing came live by
            # then, one catch-up replay once the subscription has surely arrived.
            if not await sub.poll(CATCH_UP_AFTER_MS):
                await self._replay(context, 0 if self.stream.last_seq is None else self.stream.last_seq + 1)
            taken = 0
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    self._connection_event(await monitor.recv_multipart())
                if sub not in ready:
                    continue
                frames = await sub.recv_multipart()
                if self._publisher_gone:
                    self._new_publisher()  # this batch comes again in the replay from 0
                else:
                    self._take(context, frames, live=True)
                await self._pending_replay(context)
                taken += 1
                if taken % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # a backlog must not hold the proxy's event loop
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)

    # The publisher's TCP connection dropped (its engine stopped): whatever answers once
    # the SUB socket has reconnected is another process, whatever its seqs say.
    _publisher_gone: bool = False

    def _connection_event(self, frames: list[bytes]) -> None:
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        if parse_monitor_message(frames)["event"] == zmq.EVENT_DISCONNECTED:
            self._publisher_gone = True

    def _new_publisher(self) -> None:
        self._publisher_gone = False
        self.counts.restarts += 1
        log.info(
            "KV events of %s: the publisher reconnected (its engine restarted); its cache is read anew", self.worker
        )
        self.on_reset(self.worker)
        self.stream.restart()
        self._replay_from = 0

    # A replay needs awaiting; _take only notes that one is due.
    _replay_from: int | None = None

    async def _pending_replay(self, context) -> None:
        while self._replay_from is not None:
            start, self._replay_from = self._replay_from, None
            await self._replay(context, start)

    def _take(self, context, frames: list[bytes], live: bool) -> None:
        try:
            batch = decode_message(frames)
        except BadMessage as exc:
            self.counts.bad_messages += 1
            log.debug("bad KV event message from %s: %s", self.worker, exc)
            return
        verdict = self.stream.on_batch(batch.seq)
        if verdict == EventStream.GAP:
            if live and self.source.replay_endpoint is not None and not self.replay_failed:
                self._replay_from = self.stream.last_seq + 1
                return  # this batch comes again in the replay
            # Lost for good (the engine's replay buffer has moved on): the removals in
            # them too, so what the index holds of this worker may be stale. It starts
            # again from what comes now.
            self.counts.lost_batches += batch.seq - self.stream.last_seq - 1
            self.on_reset(self.worker)
            self.stream.skip_to(batch.seq)
            verdict = EventStream.APPLY
        elif verdict == EventStream.RESTART:
            self.counts.restarts += 1
            log.info(
                "KV events of %s start again at seq %d: its engine restarted; its cache is read anew",
                self.worker,
                batch.seq,
            )
            self.on_reset(self.worker)
            self.stream.restart()
            self._replay_from = 0
            return
        if verdict == EventStream.APPLY:
            if live:
                self.stream.synced()
                self.lag_s = max(0.0, time.time() - batch.ts) if batch.ts else 0.0
            self.counts.batches += 1
            self.counts.malformed_events += batch.malformed
            self.on_batch(self.worker, batch)

    async def _replay(self, context, start: int) -> None:
        if self.source.replay_endpoint is None:
            return
        import zmq

        self.counts.replays += 1
        # Batches still queued on the SUB socket were replayed too: until the next one in
        # order comes live, an old seq from `start` on is one of those, not a new publisher.
        self.stream.begin_replay(start)
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IPV6, 1)
        dealer.connect(self.source.replay_endpoint)
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                # poll, not wait_for: a cancel during a long replay must stop it (Python
                # 3.11's wait_for drops a cancel when the message is already there).
                if not await dealer.poll(int(self.replay_timeout_s * 1000)):
                    # Later gaps are skipped rather than replayed (each try would stall
                    # the stream) until a replay answers again.
                    self.replay_failed = True
                    log.warning(
                        "KV event replay from %s got no answer in %.1f s; gaps are skipped until one does",
                        self.worker,
                        self.replay_timeout_s,
                    )
                    return
                frames = await dealer.recv_multipart()
                if len(frames) >= 3 and frames[2] == END_OF_REPLAY:
                    self.replay_failed = False
                    return
                self._take(context, frames[1:], live=False)  # frames[0] is the empty delimiter
        finally:
            dealer.close(0)
