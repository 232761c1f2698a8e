"""The proxy's routing for a planned layout: `pdspec plan`'s routing line and what `--emit`
writes as the proxy's `routing` settings.

Taken from the fleet benchmark's measurements, not from the fleet model: the model has no
prefix cache and sends every request to the least-loaded engine, so it cannot tell the proxy's
policies apart. What was measured (four Qwen3-8B-shape engines sharing one GPU as 2P2D, 3P1D
and 1P3D; the llm-d-shaped trace sc3x, every prompt about 4,400 tokens, at 3-3.4x the fleet's
KV): under TTFT p90 2 s / TPOT p90 100 ms, conditional disaggregation with kv_aware on both
pools and decode_full served as much as always-disaggregated routing or more in every run that
had both (H200 2P2D, round 4, before the pending count: 7.0 against prefix affinity's 6.5
req/s at 8 QPS, 7.0 against 3.75 at 11; H100, with the pending count: 3P1D 7.25 against
kv_aware's 2.42, 1P3D 6.88 against 2.50), 0-5% under a colocated fleet of the same engines up
to 8 QPS and 12-20% under it at 11 but in 3P1D. Under TPOT p90 50 ms always-disaggregated
prefix affinity was ahead (H200 round 4: 5.4 against 4.5 req/s; requests served whole on a
prefill worker put decode steps among its prefills). Not measured: short prompts, engines on
separate GPUs, real weights, several proxy processes.

So `advise` names conditional disaggregation only inside that regime (a P:D layout, a TPOT
SLO of at least 100 ms, prompts mostly longer than the tokens conditional disaggregation
prefills on a decode worker anyway), and otherwise keeps pdspec's defaults (prefix affinity,
always disaggregated) and says why. Every advice says it is measured on shared-GPU fleets,
not on the plan's layout.

Contract: a pure function of the layout, the SLO and the workload's shapes; it cannot fail.
An aggregated layout has no proxy routing to set (`pdspec up` runs one colocated server per
engine): None.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pdspec.plan.fleet_model import Layout, Slo
from pdspec.settings import RoutingSettings

EVIDENCE = "loadtest/results/fleet/h100-qwen3-8b/README.md, loadtest/results/fleet/h200-qwen3-8b/round4/README.md"
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


def advise(layout: Layout, slo: Slo, shapes: Sequence[tuple[int, int]]) -> RoutingAdvice | None:
    """The routing the fleet benchmark measured best for a P:D layout under `slo` with
    requests of `shapes` ((ISL, OSL) pairs); None for an aggregated layout."""
    if layout.is_aggregated:
        return None
    where = f"measured on four engines sharing one GPU, not on {layout}; {EVIDENCE}"
    short = RoutingSettings().local_prefill_max_tokens
    median_isl = statistics.median(isl for isl, _ in shapes) if shapes else 0
    if slo.tpot_p90_ms < MEASURED_TPOT_SLO_MS:
        why = (
            f"a TPOT p90 SLO under {MEASURED_TPOT_SLO_MS:g} ms, where always-disaggregated prefix affinity "
            "was ahead of conditional disaggregation"
        )
    elif median_isl <= short:
        why = (
            f"prompts mostly of at most {short} tokens, which conditional disaggregation prefills on the "
            "decode worker: not measured"
        )
    else:
        return RoutingAdvice(
            dict(CONDITIONAL),
            summary="conditional disaggregation, kv_aware on both pools: measured on the fleet benchmark, not "
            f"modelled (the figures above are the model's, always disaggregated; {where})",
        )
    return RoutingAdvice({}, summary=f"pdspec's defaults (prefix affinity, always disaggregated) for {why} ({where})")


def _flag(name: str, value: object) -> str:
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    return f"--{name} {value}"
