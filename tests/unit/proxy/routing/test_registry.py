"""The routing registry (proxy/routing/registry.py): a module for every policy the settings
accept, and each pool's policy built with its weights."""

from typing import get_args

from pdspec.contract import DecodeRoutingPolicy, RoutingPolicy
from pdspec.settings import ProxySettings
from proxy.routing import registry
from proxy.routing.policies.kv_aware import KvAware


def test_every_policy_the_settings_accept_is_registered_under_its_name():
    assert set(registry.POLICIES) == set(get_args(RoutingPolicy)) >= set(get_args(DecodeRoutingPolicy))
    for name, cls in registry.POLICIES.items():
        assert cls.name == name and cls.__module__ == f"proxy.routing.policies.{name}"


def test_each_pool_gets_a_policy_of_its_own_with_its_weights():
    settings = ProxySettings(
        routing={
            "prefill_policy": "kv_aware",
            "decode_policy": "kv_aware",
            "kv_aware_load_tokens": 300,
            "kv_aware_churn_weight": 0.7,
        }
    )
    prefill, decode = registry.for_pool(settings.routing, "prefill"), registry.for_pool(settings.routing, "decode")
    assert isinstance(prefill, KvAware) and isinstance(decode, KvAware) and prefill is not decode
    assert (prefill.load_tokens, prefill.churn_weight) == (300, 0.7)
    assert (decode.load_tokens, decode.churn_weight) == (300, 0.0)  # churn is what prefill legs compute
    default = ProxySettings().routing
    assert registry.for_pool(default, "prefill").name == default.prefill_policy
    assert registry.for_pool(default, "decode").name == default.decode_policy


def test_only_the_keyed_policies_route_by_a_key_and_only_kv_aware_reads_the_cache():
    policies = {name: registry.make(name) for name in registry.POLICIES}
    assert {n for n, p in policies.items() if p.keyed} == {"prefix_affinity", "kv_aware"}
    assert {n for n, p in policies.items() if p.cache_aware} == {"kv_aware"}
    # Every policy but round_robin reads the workers' loads (a decode leg is then picked at its hand-off).
    assert {n for n, p in policies.items() if not p.reads_load} == {"round_robin"}
