"""The routing policies by name, and the one place a pool's policy is built.

Every name the settings accept (pdspec.contract.RoutingPolicy) has its module under
proxy/routing/policies/; a new policy is a module there and a line here. `for_pool` builds
a pool's policy from the settings, its weights included, so nothing sets them on a pool
from outside; each call builds a fresh one (a policy keeps per-pool state).
"""

from __future__ import annotations

from typing import Literal

from pdspec.settings import RoutingSettings
from proxy.routing.policies.kv_aware import KvAware
from proxy.routing.policies.least_outstanding import LeastOutstanding
from proxy.routing.policies.prefix_affinity import PrefixAffinity
from proxy.routing.policies.round_robin import RoundRobin
from proxy.routing.policy import Policy

POLICIES: dict[str, type] = {cls.name: cls for cls in (RoundRobin, LeastOutstanding, PrefixAffinity, KvAware)}


def make(name: str, **weights) -> Policy:
    """A fresh policy `name`, with `weights` (kv_aware's `load_tokens`, `churn_weight`)."""
    return POLICIES[name](**weights)


def for_pool(settings: RoutingSettings, pool: Literal["prefill", "decode"]) -> Policy:
    """The policy of the prefill or the decode pool, as the `routing` group asks: kv_aware weighs a
    leg at `kv_aware_load_tokens` on both pools and cache churn at `kv_aware_churn_weight`
    on the prefill pool only (churn is what prefill legs compute; a decode worker's cache
    fills with what it pulls, chosen by its load)."""
    name = settings.prefill_policy if pool == "prefill" else settings.decode_policy
    if name != KvAware.name:
        return make(name)
    churn_weight = settings.kv_aware_churn_weight if pool == "prefill" else 0.0
    return make(name, load_tokens=settings.kv_aware_load_tokens, churn_weight=churn_weight)
