"""A prefill worker's prefill rate as the proxy sees it: prompt tokens answered per second
of the time the worker had prefill legs in flight.

Admission by queued prefill time (proxy/admission/kv_room.py) divides the prompt tokens the proxy
has in flight on a worker by this rate, to tell how long the last leg sent there would wait
behind the others. Nothing is read from the worker: the rate comes from the legs' own
replies (their `usage` counts), so it holds for any OpenAI server and needs no clock on the
worker.

- Busy time only: the wall time with at least one leg in flight, so idle gaps between
  bursts do not lower the rate.
- A sample is taken once a window holds `WINDOW_S` of busy time (the first one as soon as
  a leg is answered), then folded into a moving average (`WEIGHT`): the rate follows
  batching (more legs in flight, more tokens a second) and a slower worker within a few
  windows.
- A leg that timed out or could not reach the worker adds its busy time and no tokens: a
  worker whose legs time out reads as slow, which is what admission should then assume. A
  leg that ended for another reason (its client left, the worker refused the prompt or
  sent a bad reply) is not charged: it says nothing of the worker's speed.
- Tokens are the ones the worker computed: a reply's prompt tokens less its prefix-cache
  hits, where it reports them (a prompt served from the cache would otherwise read as a
  very fast worker).
"""

from __future__ import annotations


class PrefillRate:
    WINDOW_S = 1.0  # busy seconds a sample covers (after the first)
    WEIGHT = 0.3  # of each new sample in the average

    def __init__(self) -> None:
        self.tokens_per_s: float | None = None  # None until a leg was answered
        self.legs_in_flight = 0
        self._busy_since: float | None = None
        self._window_tokens = 0
        self._window_busy_s = 0.0

    def started(self, now: float) -> None:
        """A leg was sent to the worker at `now` (monotonic seconds)."""
        if self.legs_in_flight == 0:
            self._busy_since = now
        self.legs_in_flight += 1

    def ended(self, now: float, tokens: int | None, charged: bool = True) -> None:
        """A leg ended at `now`; `tokens`: the prompt tokens it made the worker compute (None:
        it failed); `charged`: whether its time counts as the worker's (False: it ended for
        a reason that is not the worker's speed)."""
        if self.legs_in_flight == 0 or self._busy_since is None:
            return  # an end without a start: nothing to count
        self.legs_in_flight -= 1
        if charged or self.legs_in_flight:  # other legs kept the worker busy meanwhile: their time
            self._window_busy_s += max(now - self._busy_since, 0.0)
        self._busy_since = now if self.legs_in_flight else None
        self._window_tokens += tokens or 0
        if self._window_tokens and (self.tokens_per_s is None or self._window_busy_s >= self.WINDOW_S):
            sample = self._window_tokens / max(self._window_busy_s, 1e-3)
            average = self.tokens_per_s
            self.tokens_per_s = sample if average is None else average + self.WEIGHT * (sample - average)
            self._window_tokens, self._window_busy_s = 0, 0.0

    def queued_s(self, tokens: int) -> float | None:
        """Seconds the worker needs for `tokens` of prompts at its rate (None: no rate yet)."""
        return None if not self.tokens_per_s else tokens / self.tokens_per_s
