"""What a request leaves behind when its client goes or a leg fails, against stand-in
workers: every leg of every choice closed, every in-flight count back to zero, and
prefilled KV released. (tests/e2e/test_faults.py checks the same on real workers.)"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.unit.test_proxy_failures import Cluster

STREAMED_N2 = {"model": "m", "prompt": "hello", "max_tokens": 5, "n": 2, "temperature": 1.0, "stream": True}


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)  # poll interval
    return condition()


def outstanding(cluster: Cluster) -> list[int]:
    return [w.outstanding for pool in cluster.app.state.pools for w in pool.workers]


def test_client_leaving_n2_stream_while_one_choice_decodes_closes_every_leg():
    """Choice 0 is prefilled at once and its decode stream begins; choice 1's prefill
    worker is slow, so the merged reply has not started when the client leaves. Both
    legs in flight must end: the decode stream's connection closes (vLLM aborts it) and
    the slow prefill is cancelled."""
    with Cluster(prefill_policy="round_robin") as c:
        c.p2.delay_s = 30.0
        c.d.stream_event_delay_s = 1.0  # a long generation
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(c.url + "/v1/completions", json=STREAMED_N2, timeout=1.0)
        assert wait_for(lambda: c.d.streams_abandoned == 1 and c.p2.cancelled == 1)
        assert wait_for(lambda: outstanding(c) == [0, 0, 0]), outstanding(c)
        metrics = httpx.get(c.url + "/metrics").text
    assert 'pdspec_proxy_requests_total{endpoint="completions",status="499"} 1.0' in metrics


def test_client_leaving_a_merged_stream_closes_every_choice_without_counting_errors():
    with Cluster(prefill_policy="round_robin") as c:
        c.d.stream_event_delay_s = 1.0
        with httpx.stream("POST", c.url + "/v1/completions", json=STREAMED_N2, timeout=30) as response:
            assert response.status_code == 200
            next(response.iter_lines())
        assert wait_for(lambda: c.d.streams_abandoned == 2)
        assert wait_for(lambda: outstanding(c) == [0, 0, 0]), outstanding(c)
        metrics = httpx.get(c.url + "/metrics").text
    assert "pdspec_proxy_stream_errors_total 0.0" in metrics
    assert "pdspec_proxy_leg_failures_total{" not in metrics
