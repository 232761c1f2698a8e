"""The proxy's routing for a planned layout: `pdspec plan`'s routing line and what `--emit`
writes under the proxy's `routing` settings.

Taken from the fleet benchmark's measurements, not from the fleet model: the model has no
prefix cache and sends every request to the least-loaded engine, so it cannot tell the proxy's
policies apart. On four Qwen3-8B-shape engines sharing one GPU, with the llm-d-shaped trace
sc3x at 3x the fleet's KV (loadtest/results/fleet/), conditional disaggregation with kv_aware
on both pools (decode_full and the pending count on, their defaults) served as much within
TTFT p90 2 s / TPOT p90 100 ms as always-disaggregated routing or more in every run that had
both: H200 2P2D 7.0 against prefix affinity's 6.5 req/s at 8 QPS and 7.0 against 3.75 at 11
(round 4); H100 3P1D 7.25 against kv_aware's 2.42, 1P3D 6.88 against 2.50 (the always-
disaggregated uneven splits saturate at 4 QPS); and within 1-5% of a colocated fleet of the
same engines up to 8 QPS. Not measured: 1P1D, engines on separate GPUs, real weights.

Contract: a pure function of the layout. An aggregated layout has no proxy routing to set
(`pdspec up` runs one colocated server per engine), so it gets none.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdspec.plan.fleet_model import Layout

EVIDENCE = "loadtest/results/fleet/h100-qwen3-8b/README.md"


@dataclass(frozen=True)
class RoutingAdvice:
    settings: dict[str, str]  # the proxy's routing settings (pdspec.settings.RoutingSettings fields)
    summary: str  # one line for the plan's text

    def flags(self) -> str:
        """The settings as `pdspec up` flags."""
        return " ".join(f"--proxy.routing.{name} {value}" for name, value in self.settings.items())


def advise(layout: Layout) -> RoutingAdvice | None:
    """The routing the fleet benchmark measured best for a P:D layout; None for an aggregated one."""
    if layout.is_aggregated:
        return None
    return RoutingAdvice(
        settings={"prefill_policy": "kv_aware", "decode_policy": "kv_aware", "disaggregation": "conditional"},
        summary="conditional disaggregation, kv_aware on both pools: measured on the fleet benchmark, not "
        f"modelled (the figures above are the model's, always disaggregated; {EVIDENCE})",
    )
