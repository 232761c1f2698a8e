"""The benchmarks' client: what it reads of a reply beyond its tokens (the proxy's
Server-Timing and served-by headers)."""

import asyncio

import httpx

from loadtest.serving.serve_client import completion_body, server_timing, stream_completion
from tests.proxy_cluster import PAIRED_INFO as INFO
from tests.proxy_cluster import Fleet


def test_server_timing_reads_durations_and_skips_what_has_none():
    assert server_timing("route;dur=1.5, prefill;dur=250, decode;dur=3") == {
        "route": 1.5,
        "prefill": 250.0,
        "decode": 3.0,
    }
    assert server_timing('cache;desc="hit", db;dur="53.2"') == {"db": 53.2}
    assert server_timing("x;dur=abc, y") == {} and server_timing(None) == {}


def test_a_streamed_completion_keeps_the_proxys_phases_and_workers():
    async def one(url: str):
        async with httpx.AsyncClient(timeout=30) as client:
            return await stream_completion(client, url, completion_body("m", list(range(10, 60)), 3))

    with Fleet(1, 1, INFO, observability={"served_by_headers": True}) as fleet:
        fleet.prefills[0].delay_s = 0.2
        result = asyncio.run(one(fleet.url))
        assert result.ok, result.error
        assert set(result.phases_ms) == {"route", "prefill", "decode"} and result.phases_ms["prefill"] >= 200
        assert result.ttft_s * 1000 >= sum(result.phases_ms.values())
        assert result.served_by == {"prefill": fleet.servers[0].url, "decode": fleet.servers[1].url}
    with Fleet(1, 1, INFO) as fleet:  # off: nothing to read
        result = asyncio.run(one(fleet.url))
        assert result.ok and result.phases_ms == {} and result.served_by == {}
