"""How late the proxy's event loop runs: the measure that tells a worker's silence from
the proxy's own.

A health check that times out because the proxy's loop was blocked (a slow callback, a
huge request that slipped past the limits, a paused process) says nothing about the
worker; counting it ejects healthy workers, and with all of them ejected every client
gets a 503. `LoopLag` wakes every `interval_s`, records how late it woke (the
`pdspec_proxy_event_loop_lag_seconds` histogram) and keeps the recent worst lag, so the
health checker can ask whether the loop stalled while a check ran (`stalled_since`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

INTERVAL_S = 0.1


class LoopLag:
    def __init__(self, histogram=None, interval_s: float = INTERVAL_S, keep_s: float = 120.0) -> None:
        self.histogram = histogram
        self.interval_s = interval_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max(1, int(keep_s / interval_s)))
        self._next_due: float | None = None  # when the sampler should wake next

    def record(self, woke_at: float, lag_s: float) -> None:
        self._samples.append((woke_at, lag_s))
        if self.histogram is not None:
            self.histogram.observe(lag_s)

    def worst_since(self, since: float) -> float:
        """The largest lag of a wake-up at or after `since` (time.monotonic()), and of the
        wake-up due now: when a blocked loop resumes, a timed-out check may run before the
        sampler has woken to record the block."""
        worst = max((lag for woke_at, lag in self._samples if woke_at >= since), default=0.0)
        if self._next_due is not None:
            worst = max(worst, time.monotonic() - self._next_due)
        return worst

    def stalled_since(self, since: float, threshold_s: float) -> bool:
        return self.worst_since(since) >= threshold_s

    async def run(self) -> None:
        while True:
            due = self._next_due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            woke_at = time.monotonic()
            self.record(woke_at, max(0.0, woke_at - due))
