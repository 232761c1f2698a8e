"""The fleet benchmark's policies (loadtest/serving/fleet_bench.py): each is a routing
configuration the proxy's settings accept, and the ones that keep a cache index are
exactly those with a cache-aware pool (the benchmark waits for that index's reset)."""

import pytest

from loadtest.serving import fleet_bench
from pdspec.settings import RoutingSettings


@pytest.mark.parametrize("name", list(fleet_bench.POLICIES))
def test_each_policy_is_a_routing_the_proxy_accepts(name):
    routing = RoutingSettings(**fleet_bench.POLICIES[name]["routing"])
    indexed = "kv_aware" in (routing.prefill_policy, routing.decode_policy)
    assert (name in fleet_bench.INDEXED) == indexed


def test_the_kv_aware_prefill_pair_balances_the_decode_pool_by_load():
    routing = RoutingSettings(**fleet_bench.POLICIES["kv_aware_prefill"]["routing"])
    assert (routing.prefill_policy, routing.decode_policy, routing.disaggregation) == (
        "kv_aware",
        "least_outstanding",
        "always",
    )


def test_a_reset_is_retried_while_blocks_are_held_and_a_404_is_refused_at_once():
    """vLLM answers success false while blocks are held (retry), and serves no
    /reset_prefix_cache at all without VLLM_SERVER_DEV_MODE=1 (404: waiting cannot help)."""
    import time

    from fastapi import FastAPI

    from tests.standin import ThreadServer

    held = FastAPI()
    answers = [False, False, True]

    @held.post("/reset_prefix_cache")
    async def reset():
        return {"success": answers.pop(0)}

    @held.post("/v1/completions")
    async def completion():
        return {"choices": []}

    with ThreadServer(held) as busy, ThreadServer(FastAPI()) as no_dev_mode:
        started = time.monotonic()
        record = fleet_bench.reset_caches({"prefill": [busy.url], "decode": [no_dev_mode.url]}, "m", timeout_s=30)
    assert answers == [] and time.monotonic() - started < 10
    assert record["refused"] == [f"{no_dev_mode.url}: 404: not served (the worker needs VLLM_SERVER_DEV_MODE=1)"]
