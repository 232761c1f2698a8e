"""The stall probe's per-run report (loadtest/serving/stall_probe.py): the longest gap over
every stream, the late requests with their Server-Timing, the failures; and the proxy's
loop-lag histogram read from a metrics page."""

import pytest

from loadtest.serving import stall_probe
from loadtest.serving.serve_stats import RequestResult
from tests.standin import ThreadServer


def result(ttft_s, gaps, phases=None):
    return RequestResult(True, 512, len(gaps) + 1, ttft_s, ttft_s + sum(gaps), gaps, phases_ms=phases or {})


def test_a_run_reports_its_longest_gap_and_its_late_requests():
    results = [
        result(0.1, [0.01, 5.02, 0.01]),  # a stream that stalled
        result(4.9, [0.01], {"route": 0.0, "prefill": 52.3, "decode": 2.0}),  # arrived during it
        result(0.2, [0.02]),
        RequestResult(False, 512, error="HTTP 503: busy"),
    ]
    report = stall_probe.run_report(results, 21.3, slow_ttft_s=1.0)
    assert report["window_s"] == 21.3
    assert report["max_gap_s"] == pytest.approx(5.02)
    assert report["slow"] == [{"index": 1, "ttft_s": 4.9, "phases_ms": {"route": 0.0, "prefill": 52.3, "decode": 2.0}}]
    assert report["failed"] == ["HTTP 503: busy"]


def test_a_run_of_failures_only_has_no_gap():
    assert stall_probe.run_report([RequestResult(False, error="x")], 1.0, 1.0)["max_gap_s"] == 0.0


def test_the_loop_lag_histogram_is_read_by_bucket():
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    app = FastAPI()
    page = (
        "# TYPE pdspec_proxy_event_loop_lag_seconds histogram\n"
        'pdspec_proxy_event_loop_lag_seconds_bucket{le="0.25"} 240.0\n'
        'pdspec_proxy_event_loop_lag_seconds_bucket{le="+Inf"} 241.0\n'
        "pdspec_proxy_event_loop_lag_seconds_count 241.0\n"
    )
    app.get("/metrics", response_class=PlainTextResponse)(lambda: page)
    with ThreadServer(app) as server:
        assert stall_probe.loop_lag_buckets(server.url) == {"0.25": 240.0, "+Inf": 241.0}
