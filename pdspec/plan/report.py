"""A plan as plain text (`pdspec plan`'s output): the recommended layout, its replicas per
role and K, what the model predicts for it, the proxy's routing for it (`pdspec.plan.routing`:
the rule the search chose), then the next-best alternatives and why each loses. Contract: a
pure function of the plan; it names the model's figures as predictions, never as
measurements."""

from __future__ import annotations

from pdspec.plan.fleet_model import Layout, Slo
from pdspec.plan.routing import RoutingAdvice
from pdspec.plan.search import Candidate, Plan, milliseconds

ALTERNATIVES = 5  # shown after the best; the rest are counted


def render(plan: Plan, slo: Slo, context: str, routing: RoutingAdvice | None = None) -> str:
    """`context`: one line on the profile and workload the plan is for; `routing`: the proxy's
    routing for the best layout (`pdspec.plan.routing.advise`), None for none."""
    best = plan.best
    lines = [
        context,
        f"SLO: TTFT p90 <= {milliseconds(slo.ttft_p90_ms)}, TPOT p90 <= {milliseconds(slo.tpot_p90_ms)}",
        "",
    ]
    if best.summary is None:
        lines.append(
            f"No layout meets the SLO at any rate tried; the first tried: {best.layout}, K={best.k}: {best.limit}."
        )
        return "\n".join(lines) + "\n"
    lines += [
        f"Recommended: {best.layout}, K={best.k}: {replicas(best.layout)}",
        f"  predicted: {_figures(best)}",
        f"  utilization: {_utilization(best)}",
        f"  above {best.rate_rps:.3g} req/s: {best.limit}",
    ]
    if routing is not None:
        lines.append(f"  routing: {routing.summary}")
        if routing.settings:
            lines.append(f"    {routing.flags()}")
    rest = plan.ranked[1:]
    if rest:
        lines += ["", "Alternatives (next best first):"]
        lines += [f"  {c.layout}, K={c.k}: {plan.why_loses(c)}" for c in rest[:ALTERNATIVES]]
        if len(rest) > ALTERNATIVES:
            lines.append(f"  ... and {len(rest) - ALTERNATIVES} more")
    return "\n".join(lines) + "\n"


def replicas(layout: Layout) -> str:
    if layout.is_aggregated:
        return f"{layout.colocated} colocated engines (prefill and decode on each), one GPU each"
    return f"{layout.prefill} prefill + {layout.decode} decode engines, one GPU each"


def _figures(candidate: Candidate) -> str:
    summary = candidate.summary
    return (
        f"{candidate.rate_rps:.3g} req/s sustained, goodput {candidate.goodput_rps:.3g} req/s, "
        f"TTFT p90 {milliseconds(summary.ttft_ms.p90)}, TPOT p90 {milliseconds(summary.tpot_ms.p90)}"
    )


def _utilization(candidate: Candidate) -> str:
    return ", ".join(f"{role} {busy:.0%}" for role, busy in candidate.summary.utilization.items())
