"""The proxy's routing for a planned layout (pdspec/plan/routing.py): a P:D layout the search
chose with conditional disaggregation's rule gets it, with kv_aware on both pools, as settings
the proxy accepts and as `pdspec up` flags that pdspec's CLI parses to the same, and a caveat
under a TPOT SLO tighter than the one it was measured under; a P:D layout without the rule,
pdspec's defaults and why; an aggregated layout, none."""

from __future__ import annotations

import os
import shlex

import pytest
from pydantic_settings import CliApp

from pdspec import settings as s
from pdspec.plan import routing
from pdspec.plan.fleet_model import Conditional, Layout, Slo

RELAXED = Slo(ttft_p90_ms=2000, tpot_p90_ms=100)
STRICT = Slo(ttft_p90_ms=2000, tpot_p90_ms=50)


def conditional(prefill: int, decode: int) -> Layout:
    return Layout.disaggregated(prefill, decode, conditional=Conditional())


@pytest.mark.parametrize("layout", [conditional(1, 1), conditional(3, 1), conditional(2, 6)])
def test_a_layout_with_the_rule_gets_conditional_disaggregation_with_kv_aware(layout):
    advice = routing.advise(layout, RELAXED)
    settings = s.RoutingSettings(**advice.settings)
    assert (settings.prefill_policy, settings.decode_policy, settings.disaggregation) == (
        "kv_aware",
        "kv_aware",
        "conditional",
    )
    # Set explicitly, as the model runs the rule and the fleet benchmark ran it, not left to today's defaults.
    assert (
        advice.settings["decode_on_prefill_when_full"] is True and advice.settings["decode_full_counts_pending"] is True
    )
    assert advice.conditional and "the search ranked this layout with the rule above it without" in advice.summary
    assert routing.EVIDENCE in advice.summary and "not under tighter ones" not in advice.summary


def test_the_models_rule_is_the_proxys_default_rule():
    # What the search simulates is what the advice's settings run: the proxy's own defaults.
    rule, proxy = Conditional(), s.RoutingSettings(**routing.CONDITIONAL)
    assert (rule.local_prefill_max_tokens, rule.queue_rule, rule.load_tokens) == (
        proxy.local_prefill_max_tokens,
        proxy.local_prefill_on_queue,
        proxy.kv_aware_load_tokens,
    )
    assert (rule.decode_full, rule.counts_pending) == (
        proxy.decode_on_prefill_when_full,
        proxy.decode_full_counts_pending,
    )
    assert (rule.decode_full_share, rule.decode_full_prefill_share) == (
        proxy.decode_full_share,
        proxy.decode_full_prefill_share,
    )


def test_under_a_tighter_tpot_slo_than_measured_it_says_so():
    advice = routing.advise(conditional(2, 2), STRICT)
    assert advice.conditional and "not under tighter ones" in advice.summary


def test_the_flags_set_the_same_settings_through_pdspec_ups_own_parser(monkeypatch):
    for name in [name for name in os.environ if name.startswith(s.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    advice = routing.advise(conditional(2, 2), RELAXED)
    up = CliApp.run(s.UpCommand, cli_args=shlex.split(advice.flags()))  # as pdspec/cli.py parses `pdspec up`
    assert up.proxy.routing.model_dump(include=set(advice.settings)) == advice.settings


@pytest.mark.parametrize("slo", [RELAXED, STRICT])
def test_a_layout_without_the_rule_keeps_pdspecs_defaults_and_says_why(slo):
    advice = routing.advise(Layout.disaggregated(2, 2), slo)
    assert advice.settings == {} and advice.flags() == "" and not advice.conditional
    assert advice.summary == (
        "pdspec's defaults (prefix affinity, always disaggregated): the search ranked this layout without "
        "conditional disaggregation above it with the rule"
    )


def test_an_aggregated_layout_has_no_proxy_routing_to_set():
    assert routing.advise(Layout.aggregated(4), RELAXED) is None
