"""Backpressure: at most `max_inflight` requests run, at most `max_queue` wait; the
rest get 429 with Retry-After at once, and a waiter that times out gets 503."""

from __future__ import annotations

import asyncio

from pdspec.settings import AdmissionSettings
from proxy.errors import ProxyError


class Admission:
    def __init__(self, max_inflight: int, max_queue: int, queue_timeout_s: float, retry_after_s: int) -> None:
        self.max_inflight = max_inflight
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self._slots = asyncio.Semaphore(max_inflight)
        self.inflight = 0
        self.waiting = 0

    @classmethod
    def from_settings(cls, settings: AdmissionSettings) -> Admission:
        """The queue the `admission` group describes."""
        return cls(settings.max_inflight, settings.max_queue, settings.queue_timeout_s, settings.retry_after_s)

    async def acquire(self) -> None:
        """Take a slot, wait in the queue for one, or raise 429/503. Pair with `release()`."""
        if self._slots.locked():
            if self.waiting >= self.max_queue:
                raise ProxyError(
                    429,
                    "Too many requests in flight; retry later.",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": str(self.retry_after_s)},
                )
            self.waiting += 1
            try:
                await asyncio.wait_for(self._slots.acquire(), self.queue_timeout_s)
            except asyncio.TimeoutError:
                raise ProxyError(
                    503,
                    "Timed out waiting for capacity; retry later.",
                    code="overloaded",
                    headers={"Retry-After": str(self.retry_after_s)},
                ) from None
            finally:
                self.waiting -= 1
        else:
            await self._slots.acquire()
        self.inflight += 1

    def release(self) -> None:
        self.inflight -= 1
        self._slots.release()
