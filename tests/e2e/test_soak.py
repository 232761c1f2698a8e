"""A soak of mixed requests through the real 1P1D stack (the full-size one is
`python -m loadtest.soak`): nothing lost, nothing malformed, both workers idle after."""

from __future__ import annotations

import asyncio

from loadtest.serving.soak import run_soak
from tests import harness

CI_REQUESTS = 120
CONCURRENCY = 8


def test_mixed_soak_loses_nothing(stack):
    report = asyncio.run(run_soak(stack.proxy_url, "pdspec-tiny", CI_REQUESTS, CONCURRENCY, timeout_s=120))
    assert report.problems == []
    assert report.count("ok") == CI_REQUESTS
    assert set(report.by_kind) == {"completions", "completions-stream", "chat", "chat-stream"}
    for url in (stack.prefill_url, stack.decode_url):
        assert harness.wait_idle(url) == (0, 0), url
