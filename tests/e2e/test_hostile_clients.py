"""loadtest/serving/hostile_clients.py, small, against the shared stack: while slow heads, huge
headers, unfinished bodies and idle connections are held open, a good client is still
served, the proxy's memory stays bounded and no worker is ejected."""

from __future__ import annotations

import argparse
import asyncio

from loadtest.serving import hostile_clients


def test_hostile_clients_leave_the_good_one_served(stack, tmp_path):
    args = argparse.Namespace(
        url=stack.proxy_url, seconds=6, slow_heads=10, huge_headers=2, unfinished_bodies=10, idle=10, out=str(tmp_path)
    )
    report = asyncio.run(hostile_clients.main_async(args))
    calm, attack = report["phases"]
    assert calm["good_failed"] == 0 and attack["good_failed"] == 0
    assert attack["good_ok"] > 0
    assert attack["fewest_healthy_workers"] == {"prefill": 1, "decode": 1}
    assert attack["proxy_rss_mb_peak"] - calm["proxy_rss_mb_start"] < 100  # 2 x 256 MB of headers were offered
    assert attack["client_refusals"]["header_too_large"] > 0
    assert (tmp_path / "hostile_clients.png").exists()
