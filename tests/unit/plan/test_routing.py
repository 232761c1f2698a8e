"""The proxy's routing for a planned layout (pdspec/plan/routing.py): a P:D layout inside the
regime the fleet benchmark measured (a TPOT SLO of at least 100 ms, long prompts) gets
conditional disaggregation with kv_aware, as settings the proxy accepts and as `pdspec up`
flags that pdspec's CLI parses to the same; outside it, pdspec's defaults and why; an
aggregated layout, none."""

from __future__ import annotations

import os
import shlex

import pytest
from pydantic_settings import CliApp

from pdspec import settings as s
from pdspec.plan import routing
from pdspec.plan.fleet_model import Layout, Slo

RELAXED = Slo(ttft_p90_ms=2000, tpot_p90_ms=100)
LONG = [(4352, 48), (4096, 64), (300, 64)]  # median 4,096 tokens


@pytest.mark.parametrize("layout", [Layout.disaggregated(1, 1), Layout.disaggregated(3, 1), Layout.disaggregated(2, 6)])
def test_a_pd_layout_in_the_measured_regime_gets_conditional_disaggregation_with_kv_aware(layout):
    advice = routing.advise(layout, RELAXED, LONG)
    settings = s.RoutingSettings(**advice.settings)
    assert (settings.prefill_policy, settings.decode_policy, settings.disaggregation) == (
        "kv_aware",
        "kv_aware",
        "conditional",
    )
    # Set explicitly, as the fleet benchmark ran them, not left to today's defaults.
    assert (
        advice.settings["decode_on_prefill_when_full"] is True and advice.settings["decode_full_counts_pending"] is True
    )
    assert advice.conditional and "measured on the fleet benchmark, not modelled" in advice.summary
    assert f"not on {layout}" in advice.summary and routing.EVIDENCE in advice.summary


def test_the_flags_set_the_same_settings_through_pdspec_ups_own_parser(monkeypatch):
    for name in [name for name in os.environ if name.startswith(s.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    advice = routing.advise(Layout.disaggregated(2, 2), RELAXED, LONG)
    up = CliApp.run(s.UpCommand, cli_args=shlex.split(advice.flags()))  # as pdspec/cli.py parses `pdspec up`
    assert up.proxy.routing.model_dump(include=set(advice.settings)) == advice.settings


@pytest.mark.parametrize(
    "slo, shapes, why",
    [
        (Slo(ttft_p90_ms=2000, tpot_p90_ms=50), LONG, "a TPOT p90 SLO under 100 ms"),  # always-disaggregated led
        (RELAXED, [(256, 64), (512, 64), (4096, 64)], "prompts mostly of at most 512 tokens"),  # not measured
    ],
)
def test_outside_the_measured_regime_it_keeps_pdspecs_defaults_and_says_why(slo, shapes, why):
    advice = routing.advise(Layout.disaggregated(2, 2), slo, shapes)
    assert advice.settings == {} and advice.flags() == "" and not advice.conditional
    assert advice.summary.startswith("pdspec's defaults (prefix affinity, always disaggregated) for " + why)


def test_an_aggregated_layout_has_no_proxy_routing_to_set():
    assert routing.advise(Layout.aggregated(4), RELAXED, LONG) is None
