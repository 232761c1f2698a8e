"""Fitting the fleet model's device-sharing term (`DeviceSharing`, pdspec/plan/fleet_model.py)
to a stack measured with engines sharing devices, for `plan_check --fit-sharing` and
`plan_fleet_check --fit-sharing`. The term has three forms (`--sharing-form`): alpha (the
default), demand (its one parameter, a decode step's demand c) and prefill (prefill steps
alone slowed, by prefill_alpha); a fit fits the one parameter of the form chosen.

The fit is a grid search, chosen to be simple and reproducible rather than precise: the
model is run over the measured levels at each value of the form's grid (`GRIDS`: alpha and
prefill_alpha 0 to 4 by 0.05, `GRID`; decode demand 0 to 1 by 0.05, `DEMAND_GRID`, 1 being its
most), and the value
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

from pdspec.plan.profile import SHARING_PARAMETERS

GRID = tuple(step / 20 for step in range(81))  # alpha 0 to 4 by 0.05
DEMAND_GRID = tuple(step / 20 for step in range(21))  # decode demand 0 to 1 by 0.05
GRIDS = {"alpha": GRID, "demand": DEMAND_GRID, "prefill": GRID}
PARAMETERS = SHARING_PARAMETERS  # each form's one parameter
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


def describe(form: str, value: float, origin: str) -> dict:
    """A check's report of the device term it ran with: `{"alpha": value, "from": origin}` for
    the alpha form (as reports had before the demand form), `{"form": form, <its parameter>:
    value, "from": origin}` for the demand form (decode_demand) and the prefill form
    (prefill_alpha)."""
    if form == "alpha":
        return {"alpha": value, "from": origin}
    return {"form": form, PARAMETERS[form]: value, "from": origin}


def label(sharing: dict) -> str:
    """A `describe` dict's term in words: "alpha 0.35", "decode demand 0.5 (the demand form)",
    "prefill alpha 0.38 (the prefill form)"."""
    form = sharing.get("form", "alpha")
    if form == "alpha":
        return f"alpha {sharing['alpha']:g}"
    return f"{PARAMETERS[form].replace('_', ' ')} {sharing[PARAMETERS[form]]:g} (the {form} form)"


def of_profile(profile) -> tuple[str, float]:
    """A profile's device term: its form and that form's value."""
    return profile.sharing.form, profile.sharing.value


def unfitted(args: argparse.Namespace, profile, tool: str) -> tuple | None:
    """A check's profile and its `describe` dict when it fits nothing: with `--sharing`, the
    profile with that value of `--sharing-form`'s parameter; without `--fit-sharing`, the
    profile's own term. None when `--fit-sharing` asks for a fit (the caller's, over its
    own rows)."""
    if args.sharing is not None:
        sharing = describe(args.sharing_form, args.sharing, "--sharing")
        return profile.with_sharing(args.sharing, f"{tool} --sharing", args.sharing_form), sharing
    if not args.fit_sharing:
        return profile, describe(*of_profile(profile), "the profile" if profile.device_sharing else "default")
    return None


@dataclass(frozen=True)
class SharingFit:
    alpha: float  # the fitted value of the form's parameter (alpha, decode_demand or prefill_alpha)
    error: float
    errors: tuple[tuple[float, float], ...]  # (value, error) at each grid point
    levels: int  # the rows fitted to
    figures: tuple[str, ...] = DEFAULT_FIGURES
    form: str = "alpha"

    @property
    def value(self) -> float:
        return self.alpha

    @property
    def at_edge(self) -> bool:
        # The demand form's grid ends at its parameter's most (1), not at a choice of range.
        return self.form != "demand" and self.alpha == self.errors[-1][0]

    def as_dict(self) -> dict:
        return {
            "form": self.form,
            "alpha": self.alpha,
            "error": self.error,
            "levels": self.levels,
            "at_edge": self.at_edge,
            "figures": list(self.figures),
            "errors": [list(point) for point in self.errors],
        }

    def markdown(self) -> str:
        edge = " (the grid's upper edge: the error may fall further past it)" if self.at_edge else ""
        name = PARAMETERS[self.form].replace("_", " ")
        lines = [
            f"Fitted {name} **{self.alpha:g}**{edge}: mean |log(predicted / measured)| {self.error:.3f} "
            f"(a factor of {math.exp(self.error):.2f}) over {self.levels} levels below saturation, "
            f"figures {', '.join(self.figures)} where measured.",
            "",
            f"| {name} | error |",
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
    grid: tuple[float, ...] | None = None,
    form: str = "alpha",
) -> SharingFit:
    """The value of `grid` (by default `form`'s, of GRIDS) whose rows (`rows_at(value)`: the
    model's rows of the measured levels to fit, run with `form`'s parameter at that value) have
    the least `log_error` over `figures`; ties go to the lower value. ValueError for a figure
    not in FIGURES or an unknown form."""
    unknown = set(figures) - set(FIGURES)
    if not figures or unknown:
        raise ValueError(f"a fit uses figures of {FIGURES}, got {figures}")
    if form not in GRIDS:
        raise ValueError(f"a device sharing form is one of {tuple(GRIDS)}, not {form!r}")
    grid = GRIDS[form] if grid is None else grid
    errors = []
    levels = 0
    for alpha in grid:
        rows = rows_at(alpha)
        levels = len(rows)
        errors.append((alpha, log_error(rows, figures)))
    alpha, error = min(errors, key=lambda point: (point[1], point[0]))
    return SharingFit(alpha=alpha, error=error, errors=tuple(errors), levels=levels, figures=tuple(figures), form=form)


def from_dict(fit: dict) -> SharingFit:
    """A fit back from `SharingFit.as_dict` (a report's JSON)."""
    return SharingFit(
        alpha=fit["alpha"],
        error=fit["error"],
        errors=tuple(map(tuple, fit["errors"])),
        levels=fit["levels"],
        figures=tuple(fit["figures"]),
        form=fit.get("form", "alpha"),  # reports from before the demand form have none
    )


def add_arguments(parser: argparse.ArgumentParser, fit_help: str) -> None:
    """The checks' device-term flags: `--sharing VALUE` or `--fit-sharing` (`fit_help` says
    what that check fits to), `--sharing-form` (which form either sets: alpha, the default, or
    demand), and `--fit-figures`."""
    sharing = parser.add_mutually_exclusive_group()
    sharing.add_argument(
        "--sharing",
        type=float,
        metavar="VALUE",
        help="the device term's value instead of the profile's, in --sharing-form's form "
        "(alpha >= 0; decode demand 0 to 1)",
    )
    sharing.add_argument("--fit-sharing", action="store_true", help=fit_help)
    parser.add_argument(
        "--fit-figures",
        nargs="+",
        choices=FIGURES,
        default=list(DEFAULT_FIGURES),
        help="the figures --fit-sharing fits (each where measured)",
    )
    parser.add_argument(
        "--sharing-form",
        choices=tuple(GRIDS),
        default="alpha",
        help="the device term's form that --sharing sets or --fit-sharing fits (pdspec/plan/fleet_model.py): "
        "alpha (1 + alpha (m - 1)), demand (max(1, prefill steps + decode demand x decode steps)) or prefill "
        "(prefill steps alone, 1 + prefill alpha (m - 1))",
    )


def check_value(args: argparse.Namespace) -> None:
    """SystemExit for a `--sharing` its form refuses: a negative value, a decode demand over 1."""
    if args.sharing is None:
        return
    if args.sharing_form in ("alpha", "prefill") and args.sharing < 0:
        name = "an alpha" if args.sharing_form == "alpha" else "a prefill alpha"
        raise SystemExit(f"--sharing is {name} >= 0, not {args.sharing}")
    if args.sharing_form == "demand" and not 0 <= args.sharing <= 1:
        raise SystemExit(f"--sharing is a decode demand of 0 to 1 (--sharing-form demand), not {args.sharing}")
