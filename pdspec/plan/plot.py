"""`pdspec plan --plot`: goodput against the layout (aggregated, then each P:D split), per K a
solid line (always disaggregated) and a dashed one over the splits (with conditional
disaggregation), as a PNG.

matplotlib belongs to the bench extra: it is imported here only, and only when a plot is
asked for. Failure policy: `require()` raises PlotUnavailable, saying how to install it,
when it is missing (`pdspec plan` checks before it searches, so a missing library costs no
simulation).
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

from pdspec.plan.search import Plan, layouts


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise PlotUnavailable(
            "--plot needs matplotlib, which is in pdspec's bench extra: pip install 'pdspec[bench]'"
        ) from exc


def draw(plan: Plan, path: Path, title: str) -> Path:
    require()
    from matplotlib.figure import Figure  # no pyplot: no global state, no display

    candidates = layouts(plan.best.layout.engines)
    positions = [layout for layout in candidates if layout.conditional is None]
    with_rule = [layout for layout in candidates if layout.conditional is not None]  # the splits', in order
    x_of = {layout: x for x, layout in enumerate(positions)}
    goodput = {(c.layout, c.k): c.goodput_rps for c in plan.ranked}
    width_in = max(6.0, 1.0 + 0.8 * len(positions))
    figure = Figure(figsize=(width_in, 4.5), layout="constrained")
    axes = figure.subplots()
    splits = [layout for layout in positions if not layout.is_aggregated]
    for k in sorted({c.k for c in plan.ranked}):
        (line,) = axes.plot(
            range(len(positions)), [goodput[layout, k] for layout in positions], marker="o", label=f"K={k}"
        )
        axes.plot(
            [x_of[layout] for layout in splits],
            [goodput[layout, k] for layout in with_rule],
            marker="s",
            linestyle="--",
            color=line.get_color(),
            label=f"K={k}, conditional",
        )
    best = plan.best
    x_best = x_of[dataclasses.replace(best.layout, conditional=None)]
    axes.plot([x_best], [best.goodput_rps], marker="*", markersize=16, color="black", label=f"best: {best.layout}")
    axes.set_xticks(range(len(positions)), [str(layout) for layout in positions], rotation=30, ha="right")
    axes.set_xlabel("layout (dashed: the split with conditional disaggregation)")
    axes.set_ylabel("goodput at the SLO (req/s, predicted)")
    axes.set_ylim(bottom=0)
    axes.set_title(textwrap.fill(title, width=int(12 * width_in)), fontsize=9)  # about 12 characters an inch
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.savefig(path, dpi=120)
    return Path(path)
