"""The prefill worker's queue over a measured phase: how much of the phase it had work
waiting, and its prompt-token rate while it did.

Contract:
- `QueueSampler(url, interval_s)` is an async context manager. Inside it, a task reads
  `url + "/metrics"` every `interval_s` seconds (and once more on exit) and appends a
  `QueueSample` per reading to `.samples`: monotonic time, `vllm:num_requests_waiting`,
  `vllm:num_requests_running`, `vllm:prompt_tokens_total` (summed over engines, as
  `worker_metrics.parse` sums them). A reading that fails (HTTP error, bad text) is a
  gap sample (values None); sampling goes on.
- `summarize(samples)` is pure: `saturation_share` is the share of readings with
  waiting > 0; `saturated_prefill_tokens_per_s` is the prompt-token counter's increase
  over the intervals between consecutive readings whose starting reading had waiting > 0,
  divided by those intervals' summed length (None if there is none); `samples` counts the
  readings and `gaps` the failed ones. An interval with a gap at either end is not
  counted: what the worker did across it is unknown.

A worker with requests waiting is saturated: it has more prompt work than it can take
into a step, so its rate over those intervals is its capacity, not the client's pace.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from loadtest.serving import worker_metrics

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
DEFAULT_INTERVAL_S = 0.25
SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class QueueSample:
    t: float  # time.monotonic() when the reading arrived
    waiting: float | None  # None: the reading failed (a gap)
    running: float | None = None
    prompt_tokens: float | None = None

    @property
    def gap(self) -> bool:
        return self.waiting is None


def reading(t: float, values: dict[str, float]) -> QueueSample:
    return QueueSample(
        t, values.get(WAITING, 0.0), values.get(RUNNING, 0.0), values.get(worker_metrics.PROMPT_TOKENS, 0.0)
    )


def summarize(samples: list[QueueSample]) -> dict:
    """The phase's queue figures from its samples, in time order (see the module's contract)."""
    readings = [s for s in samples if not s.gap]
    busy_tokens, busy_s = 0.0, 0.0
    for start, end in zip(samples, samples[1:]):
        if start.gap or end.gap or start.waiting <= 0:
            continue
        increase = end.prompt_tokens - start.prompt_tokens
        if increase < 0:
            continue  # the counter went back: the worker restarted within the interval
        busy_tokens += increase
        busy_s += end.t - start.t
    return {
        "samples": len(readings),
        "gaps": len(samples) - len(readings),
        "saturation_share": sum(s.waiting > 0 for s in readings) / len(readings) if readings else None,
        "saturated_prefill_tokens_per_s": busy_tokens / busy_s if busy_s > 0 else None,
    }


@dataclass
class QueueSampler:
    """Samples `url`'s queue while the `async with` body runs; `.samples` holds the readings."""

    url: str
    interval_s: float = DEFAULT_INTERVAL_S
    samples: list[QueueSample] = field(default_factory=list)
    last_error: str = ""  # the latest failed reading's error, for a report that has gaps

    async def __aenter__(self) -> QueueSampler:
        self._client = httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        self._stop.set()
        try:
            await self._task
        finally:
            await self._client.aclose()

    async def sample_once(self) -> QueueSample:
        try:
            response = await self._client.get(self.url + "/metrics")
            response.raise_for_status()
            sample = reading(time.monotonic(), worker_metrics.parse(response.text))
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: text the parser rejects
            sample = QueueSample(time.monotonic(), None)
            self.last_error = f"{type(exc).__name__}: {exc}"
        self.samples.append(sample)
        return sample

    async def _run(self) -> None:
        while not self._stop.is_set():
            await self.sample_once()
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
            except asyncio.TimeoutError:
                pass  # the interval passed: read again
        # One last reading at the end, so the final interval is measured too.
        await self.sample_once()
