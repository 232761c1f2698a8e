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
