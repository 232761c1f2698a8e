"""`pdspec plan --plot`: goodput against the layout (aggregated, then each P:D split), one
line per K, as a PNG.

matplotlib belongs to the bench extra: it is imported here only, and only when a plot is
asked for. Failure policy: `require()` raises PlotUnavailable, saying how to install it,
when it is missing (`pdspec plan` checks before it searches, so a missing library costs no
simulation).
"""

from __future__ import annotations

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

    order = layouts(plan.best.layout.engines)
    goodput = {(c.layout, c.k): c.goodput_rps for c in plan.ranked}
    width_in = max(6.0, 1.0 + 0.8 * len(order))
    figure = Figure(figsize=(width_in, 4.5), layout="constrained")
    axes = figure.subplots()
    positions = range(len(order))
    for k in sorted({c.k for c in plan.ranked}):
        axes.plot(positions, [goodput[layout, k] for layout in order], marker="o", label=f"K={k}")
    best = plan.best
    axes.plot([order.index(best.layout)], [best.goodput_rps], marker="*", markersize=16, color="black", label="best")
    axes.set_xticks(list(positions), [str(layout) for layout in order])
    axes.set_xlabel("layout: aggregated, then prefill:decode engines")
    axes.set_ylabel("goodput at the SLO (req/s, predicted)")
    axes.set_ylim(bottom=0)
    axes.set_title(textwrap.fill(title, width=int(12 * width_in)), fontsize=9)  # about 12 characters an inch
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)
    return Path(path)
