"""Fitting the fleet model's device-sharing term (`DeviceSharing.alpha`,
pdspec/plan/fleet_model.py) to a stack measured with engines sharing devices, for
`plan_check --fit-sharing` and `plan_fleet_check --fit-sharing`.

The fit is a grid search, chosen to be simple and reproducible rather than precise: the
model is run over the measured levels at each alpha of `GRID` (0 to 4 by 0.05), and the alpha
with the least error wins, the lower one on a tie. The error is the mean, over the rows (the
measured levels the caller passes: those below saturation) and the figures fitted (of
`FIGURES`; by default TTFT p90 and TPOT p50) each row has measured, of |log(predicted /
measured)|: a factor of 2 too high or too low counts the same, and no figure's scale
outweighs another's. Which figures is a choice the checks record: TPOT p50 is the figure the
device term governs most directly, TTFT also carries what the profile misses outside the
engines (a serving term, when the profile has none, or one measured at idle), which a fit to
it loads onto alpha. Saturated levels are the caller's to leave out: past
capacity the model's queues and the stack's grow at different rates whatever alpha is, and
they would dominate the error.

A fit on the data it is then checked on proves little; the checks fit on one run or trace
and check on another (loadtest/results/plan/check-h200-fleet-shared/README.md).

Failure policy: rows with no measured figure at all (nothing to fit) raise ValueError; a best
alpha at the grid's upper edge is returned, flagged `at_edge`, since the error may still fall
past it.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

GRID = tuple(step / 20 for step in range(81))  # alpha 0 to 4 by 0.05
FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms")  # what a fit may use
DEFAULT_FIGURES = ("ttft_p90_ms", "tpot_p50_ms")


def log_error(rows: list[dict], figures: tuple[str, ...] = DEFAULT_FIGURES) -> float:
    """The mean |log(predicted / measured)| over `rows`' `figures`, each where it was measured
    (older serve_bench results have no TTFT p90) and is positive."""
    errors = [
        abs(math.log(row["predicted"][figure] / row["measured"][figure]))
        for row in rows
        for figure in figures
        if row["measured"].get(figure) and row["predicted"][figure] > 0
    ]
    if not errors:
        raise ValueError("no measured figure to fit alpha to")
    return statistics.mean(errors)


@dataclass(frozen=True)
class SharingFit:
    alpha: float
    error: float
    errors: tuple[tuple[float, float], ...]  # (alpha, error) at each grid point
    levels: int  # the rows fitted to
    figures: tuple[str, ...] = DEFAULT_FIGURES

    @property
    def at_edge(self) -> bool:
        return self.alpha == self.errors[-1][0]

    def as_dict(self) -> dict:
        return {
            "alpha": self.alpha,
            "error": self.error,
            "levels": self.levels,
            "at_edge": self.at_edge,
            "figures": list(self.figures),
            "errors": [list(point) for point in self.errors],
        }

    def markdown(self) -> str:
        edge = " (the grid's upper edge: the error may fall further past it)" if self.at_edge else ""
        lines = [
            f"Fitted alpha **{self.alpha:g}**{edge}: mean |log(predicted / measured)| {self.error:.3f} "
            f"(a factor of {math.exp(self.error):.2f}) over {self.levels} levels below saturation, "
            f"figures {', '.join(self.figures)} where measured.",
            "",
            "| alpha | error |",
            "| --- | --- |",
        ]
        # Every 0.1 up to 1 and every 0.25 past it, and the best: the whole grid is in the JSON.
        shown = [
            (alpha, error)
            for alpha, error in self.errors
            if alpha == self.alpha or round(alpha * 100) % (10 if alpha <= 1 else 25) == 0
        ]
        lines += [f"| {alpha:g} | {error:.3f} |" for alpha, error in shown]
        return "\n".join(lines) + "\n"


def fit(
    rows_at: Callable[[float], list[dict]],
    figures: tuple[str, ...] = DEFAULT_FIGURES,
    grid: tuple[float, ...] = GRID,
) -> SharingFit:
    """The alpha of `grid` whose rows (`rows_at(alpha)`: the model's rows of the measured levels
    to fit, run with that alpha) have the least `log_error` over `figures`; ties go to the
    lower alpha. ValueError for a figure not in FIGURES."""
    unknown = set(figures) - set(FIGURES)
    if not figures or unknown:
        raise ValueError(f"a fit uses figures of {FIGURES}, got {figures}")
    errors = []
    levels = 0
    for alpha in grid:
        rows = rows_at(alpha)
        levels = len(rows)
        errors.append((alpha, log_error(rows, figures)))
    alpha, error = min(errors, key=lambda point: (point[1], point[0]))
    return SharingFit(alpha=alpha, error=error, errors=tuple(errors), levels=levels, figures=tuple(figures))


def from_dict(fit: dict) -> SharingFit:
    """A fit back from `SharingFit.as_dict` (a report's JSON)."""
    return SharingFit(
        alpha=fit["alpha"],
        error=fit["error"],
        errors=tuple(map(tuple, fit["errors"])),
        levels=fit["levels"],
        figures=tuple(fit["figures"]),
    )


def add_arguments(parser: argparse.ArgumentParser, fit_help: str) -> None:
    """The checks' device-term flags: `--sharing ALPHA` or `--fit-sharing` (`fit_help` says
    what that check fits to), and `--fit-figures`."""
    sharing = parser.add_mutually_exclusive_group()
    sharing.add_argument(
        "--sharing", type=float, metavar="ALPHA", help="the device term's alpha instead of the profile's (>= 0)"
    )
    sharing.add_argument("--fit-sharing", action="store_true", help=fit_help)
    parser.add_argument(
        "--fit-figures",
        nargs="+",
        choices=FIGURES,
        default=list(DEFAULT_FIGURES),
        help="the figures --fit-sharing fits (each where measured)",
    )
