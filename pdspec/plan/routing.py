"""The proxy's routing for a planned layout: `pdspec plan`'s routing line and what `--emit`
writes as the proxy's `routing` settings.

The search (`pdspec.plan.search`) tries every P:D split twice, always disaggregated and with
conditional disaggregation's rule as the proxy runs it (`fleet_model.Conditional`: short
prompts prefilled on a decode worker, decode_full with the pending count, the queue rule), and
ranks them with the rest (goodput, then rate; at the same goodput and rate a layout without
the rule first, whatever the latency: the rule must add goodput). The advice follows the
layout the search chose: conditional disaggregation with kv_aware on both pools, its
decode_full switches set explicitly, for a layout with the rule; pdspec's defaults (prefix
affinity, always disaggregated) for one without.

What stands behind it. The model's rule was checked against the fleet benchmark's H100 calls
(four Qwen3-8B-shape engines sharing one GPU as 2P2D, 3P1D and 1P3D; the llm-d-shaped trace
sc3x at 3.4x the fleet's KV; `loadtest/results/plan/check-h100-fleet/conditional/`): TTFT
p90 within a factor of 1.32-1.40 of the measured (mean over each layout's levels); it serves
whole on a prefill worker 66-89% as many requests as the proxy did. kv_aware on both pools is
what those runs used: the model has no prefix cache and cannot tell the proxy's policies
apart. Measured only under a TPOT p90 SLO of 100 ms: under 50 ms, always-disaggregated prefix
affinity was ahead on the H200 fleet (round 4: 5.4 against 4.5 req/s), so a conditional pick
under a tighter SLO says so.

Contract: a pure function of the layout and the SLO; it cannot fail. An aggregated layout has
no proxy routing to set (`pdspec up` runs one colocated server per engine): None.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdspec.plan.fleet_model import Layout, Slo

EVIDENCE = "loadtest/results/plan/check-h100-fleet/conditional/README.md"
MEASURED_TPOT_SLO_MS = 100.0  # the SLO the conditional rule was measured to win under
CONDITIONAL = {
    "prefill_policy": "kv_aware",
    "decode_policy": "kv_aware",
    "disaggregation": "conditional",
    "decode_on_prefill_when_full": True,
    "decode_full_counts_pending": True,
}


@dataclass(frozen=True)
class RoutingAdvice:
    settings: dict[str, object]  # the proxy's routing settings to set (RoutingSettings fields); {}: its defaults
    summary: str  # one line for the plan's text

    @property
    def conditional(self) -> bool:
        return self.settings.get("disaggregation") == "conditional"

    def flags(self) -> str:
        """The settings as `pdspec up` flags ("" for the defaults; a boolean is a flag or its --no- form)."""
        return " ".join(_flag(f"proxy.routing.{name}", value) for name, value in self.settings.items())


def advise(layout: Layout, slo: Slo) -> RoutingAdvice | None:
    """The proxy's routing for `layout` as the search chose it (with or without conditional
    disaggregation's rule) under `slo`; None for an aggregated layout."""
    if layout.is_aggregated:
        return None
    if layout.conditional is None:
        return RoutingAdvice(
            {},
            summary="pdspec's defaults (prefix affinity, always disaggregated): the search ranked this layout "
            "without conditional disaggregation above it with the rule",
        )
    caveat = (
        f"; measured to pay under a TPOT p90 SLO of {MEASURED_TPOT_SLO_MS:g} ms, not under tighter ones "
        "(always-disaggregated prefix affinity led at 50 ms)"
        if slo.tpot_p90_ms < MEASURED_TPOT_SLO_MS
        else ""
    )
    return RoutingAdvice(
        dict(CONDITIONAL),
        summary="conditional disaggregation, kv_aware on both pools: the search ranked this layout with the rule "
        f"above it without (the model's rule checked on four engines sharing one GPU, {EVIDENCE}{caveat})",
    )


def _flag(name: str, value: object) -> str:
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    return f"--{name} {value}"
