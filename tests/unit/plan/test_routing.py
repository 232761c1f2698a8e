"""The proxy's routing for a planned layout (pdspec/plan/routing.py): a P:D layout gets what
the fleet benchmark measured best, as settings the proxy accepts and as `pdspec up` flags
that the CLI parses to the same; an aggregated layout gets none."""

from __future__ import annotations

import os

import pytest

from pdspec import settings as s
from pdspec.plan import routing
from pdspec.plan.fleet_model import Layout


@pytest.mark.parametrize("layout", [Layout.disaggregated(1, 1), Layout.disaggregated(3, 1), Layout.disaggregated(2, 6)])
def test_a_pd_layout_gets_conditional_disaggregation_with_kv_aware_on_both_pools(layout):
    advice = routing.advise(layout)
    settings = s.RoutingSettings(**advice.settings)
    assert (settings.prefill_policy, settings.decode_policy, settings.disaggregation) == (
        "kv_aware",
        "kv_aware",
        "conditional",
    )
    # The rest stays at the defaults the fleet benchmark ran with (decode_full and the pending count on).
    assert settings.decode_on_prefill_when_full and settings.decode_full_counts_pending
    assert "measured on the fleet benchmark, not modelled" in advice.summary and routing.EVIDENCE in advice.summary


def test_the_flags_set_the_same_settings_through_pdspec_ups_own_parser(monkeypatch):
    for name in [name for name in os.environ if name.startswith(s.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    advice = routing.advise(Layout.disaggregated(2, 2))
    up = s.UpCommand(_cli_parse_args=advice.flags().split())
    assert up.proxy.routing.model_dump(include=set(advice.settings)) == advice.settings


def test_an_aggregated_layout_has_no_proxy_routing_to_set():
    assert routing.advise(Layout.aggregated(4)) is None
