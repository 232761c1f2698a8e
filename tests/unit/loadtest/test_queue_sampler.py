"""The prefill queue sampler: its pure summary over hand-made samples, and its loop against
a small local server whose /metrics text changes from one read to the next."""

from __future__ import annotations

import asyncio
import threading

import pytest
from fastapi import FastAPI
from starlette.responses import Response

from loadtest.serving.queue_sampler import QueueSample, QueueSampler, summarize
from tests.standin import ThreadServer, free_port


def test_rate_counts_only_intervals_that_start_with_requests_waiting():
    samples = [
        QueueSample(0.0, waiting=2, running=1, prompt_tokens=0),
        QueueSample(1.0, waiting=1, running=2, prompt_tokens=1000),
        QueueSample(2.0, waiting=0, running=2, prompt_tokens=1500),  # ends a saturated interval
        QueueSample(3.0, waiting=0, running=1, prompt_tokens=1600),  # idle interval: not counted
        QueueSample(4.0, waiting=3, running=1, prompt_tokens=1600),
        QueueSample(4.5, waiting=2, running=1, prompt_tokens=2100),
    ]
    summary = summarize(samples)
    assert summary["samples"] == 6 and summary["gaps"] == 0
    assert summary["saturation_share"] == pytest.approx(4 / 6)
    # 1000 + 500 + 500 tokens over 1 + 1 + 0.5 s; the whole window would give 2100 / 4.5.
    assert summary["saturated_prefill_tokens_per_s"] == pytest.approx(800.0)


def test_no_interval_with_requests_waiting_gives_no_rate():
    samples = [QueueSample(float(t), waiting=0, running=1, prompt_tokens=100.0 * t) for t in range(4)]
    summary = summarize(samples)
    assert summary["saturation_share"] == 0.0
    assert summary["saturated_prefill_tokens_per_s"] is None
    # A last reading with requests waiting starts no interval: still no rate.
    assert (
        summarize([*samples, QueueSample(4.0, waiting=5, running=1, prompt_tokens=400)])[
            "saturated_prefill_tokens_per_s"
        ]
        is None
    )
    assert summarize([]) == {"samples": 0, "gaps": 0, "saturation_share": None, "saturated_prefill_tokens_per_s": None}


def test_a_gap_is_no_reading_and_its_intervals_are_not_counted():
    samples = [
        QueueSample(0.0, waiting=2, running=1, prompt_tokens=0),
        QueueSample(1.0, waiting=None),  # the scrape failed
        QueueSample(2.0, waiting=2, running=1, prompt_tokens=2000),
        QueueSample(3.0, waiting=1, running=1, prompt_tokens=2600),
        QueueSample(4.0, waiting=0, running=1, prompt_tokens=3000),
    ]
    summary = summarize(samples)
    assert (summary["samples"], summary["gaps"]) == (4, 1)
    assert summary["saturation_share"] == pytest.approx(3 / 4)
    # Only 2->3 and 3->4: spanning the gap (0->2) would add 2000 tokens over 2 s.
    assert summary["saturated_prefill_tokens_per_s"] == pytest.approx(500.0)


def test_a_counter_that_goes_back_is_not_a_negative_rate():
    samples = [QueueSample(0.0, 1, 1, 5000), QueueSample(1.0, 1, 1, 10), QueueSample(2.0, 1, 1, 410)]
    assert summarize(samples)["saturated_prefill_tokens_per_s"] == pytest.approx(400.0)


def _metrics(waiting: tuple[int, int], running: int, prompt_tokens: int) -> str:
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0"}} {waiting[0]}.0\n'
        f'vllm:num_requests_waiting{{engine="1"}} {waiting[1]}.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}.0\n'
        "# TYPE vllm:prompt_tokens counter\n"
        f'vllm:prompt_tokens_total{{engine="0"}} {prompt_tokens}.0\n'
    )


def _scripted_metrics_app(script: list[tuple[int, str]], finished: threading.Event) -> FastAPI:
    """/metrics answers the script's (status, text) in turn, then its last entry for good;
    `finished` is set once every entry was served."""
    app = FastAPI()
    reads = []

    @app.get("/metrics")
    async def metrics():
        status, text = script[min(len(reads), len(script) - 1)]
        reads.append(status)
        if len(reads) >= len(script):
            finished.set()
        return Response(text, status_code=status, media_type="text/plain")

    return app


async def test_sampler_reads_changing_metrics_and_records_a_failed_read_as_a_gap():
    script = [
        (200, _metrics((1, 1), running=1, prompt_tokens=0)),
        (200, _metrics((1, 0), running=2, prompt_tokens=1000)),
        (500, "busy"),
        (200, _metrics((0, 0), running=1, prompt_tokens=1500)),
    ]
    finished = threading.Event()
    with ThreadServer(_scripted_metrics_app(script, finished)) as server:
        async with QueueSampler(server.url, interval_s=0.01) as sampler:
            assert await asyncio.to_thread(finished.wait, 10), "the sampler did not read the whole script"
    samples = sampler.samples
    assert [(s.waiting, s.running, s.prompt_tokens) for s in samples[:2]] == [(2, 1, 0), (1, 2, 1000)]
    assert samples[2].gap and "500" in sampler.last_error
    # The last entry, read until the sampler stopped, then once more on the way out.
    assert len(samples) >= 5 and all((s.waiting, s.prompt_tokens) == (0, 1500) for s in samples[3:])
    assert all(a.t < b.t for a, b in zip(samples, samples[1:]))
    summary = summarize(samples)
    assert (summary["samples"], summary["gaps"]) == (len(samples) - 1, 1)
    assert summary["saturation_share"] == pytest.approx(2 / (len(samples) - 1))
    # Only the first interval counts: the second ends in the gap, the rest have none waiting.
    assert summary["saturated_prefill_tokens_per_s"] == pytest.approx(1000.0 / (samples[1].t - samples[0].t))


async def test_an_unreachable_worker_gives_gaps_not_a_crash():
    async with QueueSampler(f"http://127.0.0.1:{free_port()}", interval_s=0.01) as sampler:
        pass
    assert sampler.samples and all(s.gap for s in sampler.samples)
    assert "ConnectError" in sampler.last_error
    summary = summarize(sampler.samples)
    assert summary["samples"] == 0 and summary["saturation_share"] is None
