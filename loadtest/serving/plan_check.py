"""`python -m loadtest.plan_check`: the fleet model's predictions (pdspec/plan/fleet_model.py)
beside what a real stack measured, for the planner's validation (issue 43's table).

It reads `serve_bench` results taken with Poisson arrivals (`--request-rate`): for each
phase, the same number of requests of the same shape at the same rate go through the fleet
model with the profile, `--seeds` times (arrivals differ by seed, as two runs of the real
stack would), and the medians of those runs are set beside the measured figures: request
throughput, TTFT median, p90 (results of serve_bench from before it kept a p90
show "-") and p99, TPOT median. The model's decode gain per step is the one
the stack's decode worker measured in that phase (its acceptance length), unless
`--profile-acceptance`: the profile's was measured on other prompts. `--devices N` says the
measured stack ran its engines on N devices (the CPU 2P1D on two cores, four engines on one
H200): the model then puts them on N devices round robin (or as `--placement` says), the
steps on a device slowing each other by the profile's device term (`DeviceSharing`);
by default each engine had a device of its own. `--sharing VALUE` runs with another value;
`--fit-sharing` fits it first (`loadtest.serving.sharing_fit`: a grid over the value, against
the phases whose rate is at most the measured goodput, so it needs `--goodput-slo`), then
checks with the fitted value, and records the fit; either is alpha, or with `--sharing-form
demand` the demand form's decode demand, with `--sharing-form prefill` the prefill form's
prefill_alpha. `--serving-from-rate R` takes the profile's serving
term (the time outside the engines) from the measured phase at R req/s instead of the idle
probe it came from: the term for the layout's kind becomes the one that makes the model's
TTFT p50 there the measured (the profile's term plus the difference); that phase then
matches by construction and the others are the check (the H200 1P1D paid 145-290 ms more
under load than the idle probe said: loadtest/results/plan/check-h200-1p1d-r2/).

Written to `--out`: `plan_check.json` (every phase, measured and predicted) and
`plan_check.md` (the table, with the predicted / measured ratio of each figure). Failure
policy: a results file without Poisson phases, a layout the profile cannot run, more
devices than engines (or none), a `--sharing` its form refuses, `--fit-sharing` without
`--goodput-slo`, a `--serving-from-rate` no phase ran at, or one with `--fit-sharing` stops
it with the reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from loadtest.serving import sharing_fit
from pdspec.plan import profile as profiles
from pdspec.plan.fleet_model import Conditional, Layout, Slo, simulate
from pdspec.plan.search import evaluate
from pdspec.plan.workload import poisson

NO_SLO = Slo(ttft_p90_ms=float("inf"), tpot_p90_ms=float("inf"))
# A split's routing rule by name: the proxy's defaults, and the same without the pending count
# (routing.decode_full_counts_pending off: what the H200 fleet's rounds 3-5 ran).
RULES = {"conditional": Conditional(), "conditional-no-pending": Conditional(counts_pending=False)}


def layout_of(spec: str, devices: int | None = None, placement: str | None = None) -> Layout:
    """'1p1d' / '2p1d' (P prefill, D decode engines), the same with '+conditional' (routed by
    conditional disaggregation's rule, the proxy's defaults: `Conditional()`) or
    '+conditional-no-pending' (the same without the pending count), or 'colocated-N',
    on `devices` devices (None: one per engine) or placed by `placement` ('0,0,1': each engine's
    device, prefill engines first). Raises ValueError for a spec it cannot read, a device count
    outside 1 to the engines, or a placement that does not name each engine's device."""
    device_of = tuple(int(d) for d in placement.split(",")) if placement else None
    engines, plus, rule = spec.lower().partition("+")
    if spec.startswith("colocated-"):
        if plus:
            raise ValueError(f"{spec}: colocated engines take no routing rule")
        return Layout.aggregated(int(spec.removeprefix("colocated-")), devices, device_of)
    if plus and rule not in RULES:
        raise ValueError(f"{spec}: the rules a layout takes are {', '.join('+' + name for name in RULES)}")
    prefill, _, decode = engines.removesuffix("d").partition("p")
    conditional = RULES[rule] if plus else None
    return Layout.disaggregated(int(prefill), int(decode), devices, device_of, conditional)


def load_profile(name: str, k: int) -> profiles.EngineProfile:
    """A shipped profile by its name, or one from a file; SystemExit when it has no decode
    curve for `k`."""
    profile = profiles.load(profiles.shipped().get(name) or Path(name))
    if k not in profile.decode:
        raise SystemExit(f"{name} has no decode curve for K={k} (it has K={sorted(profile.decode)})")
    return profile


def write_report(out: Path, stem: str, report: dict, table: str) -> None:
    """`stem`.json (the report) and `stem`.md (its table) under `out`; the table printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    (out / f"{stem}.md").write_text(table)
    print(table)


def with_acceptance(profile: profiles.EngineProfile, k: int, tokens_per_step: float) -> profiles.EngineProfile:
    """`profile` with K's decode gain per step replaced."""
    decode = dict(profile.decode)
    decode[k] = decode[k].model_copy(update={"tokens_per_step": max(1.0, tokens_per_step)})
    return profile.model_copy(update={"decode": decode})


def predict(
    profile, layout: Layout, k: int, rate: float, count: int, isl: int, osl: int, seeds: int, slo: Slo | None = None
) -> dict:
    """The medians over `seeds` runs of the model: throughput, TTFT p50/p90/p99, TPOT p50; with
    `slo`, also its goodput as serve_bench measures a phase's (`goodput_rps`: the requests
    meeting both thresholds one by one, over the run's length), the share of requests meeting
    both (`attainment`) and TPOT p90 (what fleet_report's levels pass or fail on, with TTFT p90).
    A layout with conditional disaggregation also gets `routes`: the requests served each way
    (`FleetRun.routes`' reasons), medians over the seeds."""
    runs, routes = [], []
    for seed in range(seeds):
        run = simulate(profile, layout, k, poisson(rate, count, [(isl, osl)], seed))
        runs.append(run.summary(slo or NO_SLO))
        routes.append(run.routes)
    predicted = {
        "throughput_rps": statistics.median(s.throughput_rps for s in runs),
        "ttft_p50_ms": statistics.median(s.ttft_ms.p50 for s in runs),
        "ttft_p90_ms": statistics.median(s.ttft_ms.p90 for s in runs),
        "ttft_p99_ms": statistics.median(s.ttft_ms.p99 for s in runs),
        "tpot_p50_ms": statistics.median(s.tpot_ms.p50 for s in runs),
    }
    if slo is not None:
        predicted["goodput_rps"] = statistics.median(s.goodput_rps for s in runs)
        predicted["attainment"] = statistics.median(s.attainment for s in runs)
        predicted["tpot_p90_ms"] = statistics.median(s.tpot_ms.p90 for s in runs)
    if layout.conditional is not None:  # how conditional disaggregation served them, by reason
        reasons = sorted({reason for counts in routes for reason in counts})
        predicted["routes"] = {
            reason: statistics.median(counts.get(reason, 0) for counts in routes) for reason in reasons
        }
    return predicted


def phase_rows(
    profile,
    layout: Layout,
    k: int,
    loaded: list[tuple[Path, dict]],
    seeds: int,
    profile_acceptance: bool,
    verbose=False,
    slo: Slo | None = None,
) -> list[dict]:
    """Each Poisson phase of the `loaded` serve_bench results beside the model's run of it
    (with `slo`, its goodput too: `predict`)."""
    rows = []
    for path, results in loaded:
        for phase in (phase for phase in results["phases"] if phase.get("request_rate")):
            tokens_per_step = profile.decode[k].tokens_per_step
            if not profile_acceptance and phase.get("decode_acceptance_length"):
                tokens_per_step = phase["decode_acceptance_length"]
            model = with_acceptance(profile, k, tokens_per_step)
            count = phase["completed"]
            predicted = predict(
                model, layout, k, phase["request_rate"], count, results["input_len"], results["output_len"], seeds, slo
            )
            rows.append(
                {
                    "results": str(path.parent.name),
                    "rate": phase["request_rate"],
                    "requests": count,
                    "tokens_per_step": tokens_per_step,
                    "measured": measured_of(phase),
                    "predicted": predicted,
                }
            )
            if verbose:
                print(
                    f"{path.parent.name} rate {phase['request_rate']:g}: {rows[-1]['measured']} vs {predicted}",
                    flush=True,
                )
    return rows


def measured_goodput(args: argparse.Namespace, loaded: list[tuple[Path, dict]]) -> float:
    """The best measured phase's goodput, which must have been taken under `--goodput-slo`
    (serve_bench's `slos_ms`; SystemExit otherwise)."""
    ttft_ms, tpot_ms = args.goodput_slo
    measured = 0.0
    for path, results in loaded:
        for phase in results["phases"]:
            if not phase.get("request_rate"):
                continue
            if phase.get("slos_ms") != {"ttft": ttft_ms, "tpot": tpot_ms}:
                raise SystemExit(
                    f"{path}: its goodput was measured under {phase.get('slos_ms')}, not {args.goodput_slo}"
                )
            measured = max(measured, phase.get("goodput") or 0.0)
    return measured


def sharing_of(args: argparse.Namespace, profile, layout: Layout, loaded: list[tuple[Path, dict]]) -> tuple:
    """The profile the check runs with and what its device term is: the profile's own,
    `--sharing`'s, or `--fit-sharing`'s (fitted to the phases whose rate is at most the
    measured goodput: the loads the stack served within the SLO; the fit's table is printed)."""
    if (given := sharing_fit.unfitted(args, profile, "plan_check")) is not None:
        return given
    form = args.sharing_form
    if not args.goodput_slo:
        raise SystemExit(
            "--fit-sharing fits to the phases below saturation, which --goodput-slo's measured goodput marks"
        )
    goodput = measured_goodput(args, loaded)

    def rows_at(value: float) -> list[dict]:
        model = profile.with_sharing(value, "a trial of plan_check --fit-sharing", form)
        rows = phase_rows(model, layout, args.k, loaded, args.seeds, args.profile_acceptance)
        return [row for row in rows if row["rate"] <= goodput]

    fitted = sharing_fit.fit(rows_at, tuple(args.fit_figures), form=form)
    print(fitted.markdown(), flush=True)
    source = f"fitted by plan_check --fit-sharing to {', '.join(str(path) for path, _ in loaded)}"
    return profile.with_sharing(fitted.value, source, form), sharing_fit.describe(
        form, fitted.value, "--fit-sharing"
    ) | {"fit": fitted.as_dict() | {"below_goodput_rps": goodput}}


def serving_from_rate(
    args: argparse.Namespace, profile, layout: Layout, loaded: list[tuple[Path, dict]]
) -> tuple[profiles.EngineProfile, dict | None]:
    """The profile with the serving term `--serving-from-rate` takes from the measured phase
    at that rate (in the first results file that has one), and the record of it; the profile
    unchanged and None without the option. The layout's kind of term (aggregated or disaggregated) is set
    to the profile's (0 without one) plus the phase's measured TTFT p50 less the model's,
    never below 0; the other kind is kept. SystemExit when no Poisson phase ran at the rate."""
    rate = args.serving_from_rate
    if rate is None:
        return profile, None
    found = next(
        (
            (path, results, phase)
            for path, results in loaded
            for phase in results["phases"]
            if phase.get("request_rate") == rate
        ),
        None,
    )
    if found is None:
        rates = sorted(
            {phase["request_rate"] for _, results in loaded for phase in results["phases"] if phase.get("request_rate")}
        )
        raise SystemExit(f"--serving-from-rate {rate:g}: no phase ran at that rate (the results have {rates})")
    path, results, phase = found
    [row] = phase_rows(
        profile, layout, args.k, [(path, {**results, "phases": [phase]})], args.seeds, args.profile_acceptance
    )
    measured, predicted = row["measured"]["ttft_p50_ms"], row["predicted"]["ttft_p50_ms"]
    source = f"plan_check --serving-from-rate {rate:g}: {path}'s phase at {rate:g} req/s (TTFT p50 {measured:.1f} ms)"
    served, term = with_serving_term(profile, layout.is_aggregated, measured, predicted, source)
    record = {"from_rate": rate, **term, "measured_ttft_p50_ms": measured, "results": str(path.parent.name)}
    return served, record


def with_serving_term(
    profile: profiles.EngineProfile, aggregated: bool, measured_ms: float, predicted_ms: float, source: str
) -> tuple[profiles.EngineProfile, dict]:
    """`profile` with its serving term of the layout's kind (aggregated or disaggregated) made
    the one that brings a modelled TTFT p50 of `predicted_ms` to the measured `measured_ms`:
    the profile's term (0 without one) plus the difference, never below 0 (`clamped`: the
    model is above the measured even without one); the other kind is kept. Also the record of
    it: kind, profile_ms, term_ms, model_ttft_p50_ms_before, clamped."""
    was = profile.serving_ms.for_layout(aggregated) if profile.serving_ms is not None else 0.0
    term = max(0.0, was + measured_ms - predicted_ms)
    kind, other = ("aggregated_ms", "disaggregated_ms") if aggregated else ("disaggregated_ms", "aggregated_ms")
    serving = profiles.ServingOverhead(
        **{kind: term, other: getattr(profile.serving_ms, other) if profile.serving_ms is not None else 0.0},
        source=source,
    )
    record = {
        "kind": kind,
        "profile_ms": round(was, 1),
        "term_ms": round(term, 1),
        "model_ttft_p50_ms_before": round(predicted_ms, 1),
        "clamped": was + measured_ms - predicted_ms < 0,
    }
    return profile.model_copy(update={"serving_ms": serving}), record


def measured_of(phase: dict) -> dict:
    return {
        "throughput_rps": phase["request_throughput"],
        "ttft_p50_ms": phase["ttft_ms"]["median"],
        "ttft_p90_ms": phase["ttft_ms"].get("p90"),  # None in results from before serve_bench kept it
        "ttft_p99_ms": phase["ttft_ms"]["p99"],
        "tpot_p50_ms": phase["tpot_ms"]["median"],
    }


def goodput_of(
    args: argparse.Namespace, profile, layout: Layout, rows: list[dict], loaded: list[tuple[Path, dict]]
) -> dict:
    """The model's goodput of the layout under `--goodput-slo` (with the phases' mean
    acceptance unless `--profile-acceptance`) and the best measured phase's, which must have
    been taken under the same SLO (serve_bench's `slos_ms`; SystemExit otherwise). Two
    predictions: the planner's (`predicted_rps`: the steady rate whose p90s meet the SLO,
    `pdspec.plan.search.evaluate`) and the measured figure's own (`predicted_phases_rps`: the
    best of the model's runs of the same phases, each its requests meeting the SLO one by one
    over its length): phases of a few seconds end before a queue reaches its steady length, so
    only the second compares like with like."""
    ttft_ms, tpot_ms = args.goodput_slo
    measured = measured_goodput(args, loaded)
    shapes = [(results["input_len"], results["output_len"]) for _, results in loaded]
    tokens_per_step = statistics.mean(row["tokens_per_step"] for row in rows)
    model = profile if args.profile_acceptance else with_acceptance(profile, args.k, tokens_per_step)
    candidate = evaluate(model, layout, args.k, shapes[:1], Slo(ttft_p90_ms=ttft_ms, tpot_p90_ms=tpot_ms))
    return {
        "slo_ms": [ttft_ms, tpot_ms],
        "predicted_rps": round(candidate.goodput_rps, 2),
        "predicted_phases_rps": round(max(row["predicted"].get("goodput_rps", 0.0) for row in rows), 2),
        "measured_rps": round(measured, 2),
        "measured_is_lower_bound": slo_held_at_the_top(args, loaded),
    }


def slo_held_at_the_top(args: argparse.Namespace, loaded: list[tuple[Path, dict]]) -> bool:
    """Whether the highest-rate phase still met `--goodput-slo` at its p90s: then the sweep
    never reached the rate the SLO bounds, and the measured goodput (a phase's throughput,
    with its drain) is a lower bound, not the stack's goodput (the H200 1P1D check's first
    run: 8.2 req/s measured at 20/s offered, the SLO never near)."""
    ttft_ms, tpot_ms = args.goodput_slo
    phases = [phase for _, results in loaded for phase in results["phases"] if phase.get("request_rate")]
    if not phases:
        return False
    top = max(phases, key=lambda phase: phase["request_rate"])
    ttft_p90, tpot_p90 = top["ttft_ms"].get("p90"), top["tpot_ms"].get("p90")
    return ttft_p90 is not None and tpot_p90 is not None and ttft_p90 <= ttft_ms and tpot_p90 <= tpot_ms


def sharing_lines(sharing: dict) -> list[str]:
    """The device term the check ran with, and its fit's table when it was fitted."""
    lines = [f"Device sharing {sharing_fit.label(sharing)} ({sharing['from']}).", ""]
    if "fit" in sharing:
        fit = sharing["fit"]
        lines += [
            f"Fitted to the levels at most the measured goodput ({fit['below_goodput_rps']:g} req/s): "
            + sharing_fit.from_dict(fit).markdown(),
        ]
    return lines


FIGURES = ("throughput_rps", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms")


def serving_lines(serving: dict) -> list[str]:
    """The report's lines on a serving term taken from a measured phase (`serving_from_rate`)."""
    kind = serving["kind"].removesuffix("_ms")
    matched = (
        "That phase's modelled TTFT is above the measured even with no serving term, so it is 0 and the "
        "phase does not match; the others are the check."
        if serving.get("clamped")
        else "That phase matches by construction; the others are the check."
    )
    return [
        f"Serving term ({kind}) taken from the {serving['from_rate']:g} req/s phase: {serving['term_ms']:g} ms "
        f"(the profile's {serving['profile_ms']:g} ms; that phase's TTFT p50 {serving['measured_ttft_p50_ms']:.1f} ms "
        f"measured, {serving['model_ttft_p50_ms_before']:g} ms modelled with the profile's term). {matched}",
        "",
    ]


def markdown(report: dict) -> str:
    devices = report["devices"]
    # Named only when shared, so that a table of one engine per device reads as it always did.
    on = f" on {devices} device{'s' if devices > 1 else ''}" if devices < report["engines"] else ""
    lines = [
        f"# The fleet model against {report['layout']}{on} measured ({report['profile']})",
        "",
        f"`{report['command']}`",
        "",
        *(
            [
                f"Goodput under TTFT {report['goodput']['slo_ms'][0]:g} ms and TPOT {report['goodput']['slo_ms'][1]:g} ms: "
                f"measured {report['goodput']['measured_rps']} req/s (the best phase's requests meeting both"
                + (
                    "; **a lower bound**: the highest rate tried still met the SLO at its p90s"
                    if report["goodput"].get("measured_is_lower_bound")
                    else ""
                )
                + f"), predicted "
                f"{report['goodput']['predicted_rps']} req/s (the highest rate whose p90s meet both, times the share "
                "meeting both)"
                + (
                    f"; by the same phases, as measured: {report['goodput']['predicted_phases_rps']} req/s (the best "
                    "of the model's runs of them, its requests meeting both one by one)."
                    if "predicted_phases_rps" in report["goodput"]
                    else "."
                ),
                "",
            ]
            if report.get("goodput")
            else []
        ),
        *(
            [f"Devices of the engines, prefill engines first: {report['placement']}.", ""]
            if on and "placement" in report
            else []
        ),
        *(sharing_lines(report["sharing"]) if on and report.get("sharing") else []),
        *(serving_lines(report["serving"]) if report.get("serving") else []),
        "Each cell: measured / predicted (predicted over measured). Predicted: the median of "
        f"{report['seeds']} runs of the model with the phase's rate, request count and shape.",
        "",
        "| results | rate /s | acceptance | throughput req/s | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | TPOT p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["phases"]:
        cells = []
        for figure in FIGURES:
            measured, predicted = row["measured"][figure], row["predicted"][figure]
            if measured is None:
                cells.append(f"- / {predicted:,.1f}")
                continue
            ratio = predicted / measured if measured else float("nan")
            cells.append(f"{measured:,.1f} / {predicted:,.1f} ({ratio:.2f})")
        serving = report.get("serving")
        fitted = (
            " (the serving term's)"
            if serving
            and row["rate"] == serving["from_rate"]
            and row["results"] == serving.get("results", row["results"])
            else ""
        )
        lines.append(
            f"| {row['results']} | {row['rate']:g}{fitted} | {row['tokens_per_step']:.2f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


PLOTTED = (
    ("throughput_rps", "throughput req/s"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p90_ms", "TTFT p90 ms"),
    ("tpot_p50_ms", "TPOT p50 ms"),
)


def plot(report: dict, path: Path) -> None:
    """Measured and predicted against the offered rate, one panel a figure (a line per
    results file, measured solid with dots, predicted dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(4.2 * len(PLOTTED), 3.6))
    for ax, (figure, label) in zip(axes, PLOTTED):
        for index, results in enumerate(dict.fromkeys(row["results"] for row in report["phases"])):
            rows = sorted((row for row in report["phases"] if row["results"] == results), key=lambda r: r["rate"])
            color = f"C{index}"
            measured = [(row["rate"], row["measured"][figure]) for row in rows if row["measured"][figure] is not None]
            if measured:
                ax.plot(*zip(*measured), "o-", color=color, label=f"{results} measured")
            ax.plot(
                [r["rate"] for r in rows],
                [r["predicted"][figure] for r in rows],
                "--",
                color=color,
                label=f"{results} predicted",
            )
        ax.set_xlabel("offered rate, req/s")
        ax.set_title(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"The fleet model against {report['layout']} measured ({Path(report['profile']).name})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m loadtest.plan_check", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", required=True, help="a shipped profile's name or a file")
    parser.add_argument("--layout", required=True, help="1p1d, 2p1d, ... or colocated-N")
    parser.add_argument("--k", type=int, required=True, help="the stack's draft length")
    parser.add_argument("--devices", type=int, help="the devices the stack's engines shared (default: one per engine)")
    parser.add_argument(
        "--placement",
        help="each engine's device, prefill engines first, e.g. 0,0,1 for pdspec's CPU 2P1D (both prefill workers "
        "on core 0); default: round robin over --devices",
    )
    parser.add_argument("--results", type=Path, nargs="+", required=True, help="serve_bench.json files")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--goodput-slo",
        nargs=2,
        type=float,
        metavar=("TTFT_MS", "TPOT_MS"),
        help="also the layout's goodput under this SLO: the model's (the search's rate meeting both p90s, "
        "pdspec.plan.search.evaluate) beside the best measured phase's (serve_bench --goodput: requests "
        "meeting both one by one), so that layouts can be ranked both ways",
    )
    parser.add_argument("--profile-acceptance", action="store_true")
    sharing_fit.add_arguments(
        parser,
        "fit alpha to the phases below saturation (rate <= measured goodput; needs --goodput-slo), "
        "loadtest.serving.sharing_fit's grid, and check with it",
    )
    parser.add_argument(
        "--serving-from-rate",
        type=float,
        metavar="RATE",
        help="take the serving term from the measured phase at RATE req/s (its TTFT p50), not the profile's "
        "idle probe; that phase then matches by construction, the others are the check",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        layout = layout_of(args.layout, args.devices, args.placement)
    except ValueError as error:
        devices = args.placement or args.devices or "one per engine"
        raise SystemExit(f"cannot model --layout {args.layout} on devices {devices}: {error}") from None
    sharing_fit.check_value(args)
    if args.serving_from_rate is not None and args.fit_sharing:
        # A fit to TTFT with the idle term takes part of the missing serving time into its
        # value: with the term from the phase as well, that time would count twice.
        raise SystemExit(
            "--serving-from-rate and --fit-sharing: take the device term from --sharing, or fit without it"
        )
    profile = load_profile(args.profile, args.k)
    loaded = [(path, json.loads(path.read_text())) for path in args.results]
    for path, results in loaded:
        if not any(phase.get("request_rate") for phase in results["phases"]):
            raise SystemExit(f"{path}: no phase with Poisson arrivals (serve_bench --request-rate)")
    profile, sharing = sharing_of(args, profile, layout, loaded)
    profile, serving = serving_from_rate(args, profile, layout, loaded)
    slo = Slo(ttft_p90_ms=args.goodput_slo[0], tpot_p90_ms=args.goodput_slo[1]) if args.goodput_slo else None
    rows = phase_rows(profile, layout, args.k, loaded, args.seeds, args.profile_acceptance, verbose=True, slo=slo)
    goodput = None
    if args.goodput_slo:
        goodput = goodput_of(args, profile, layout, rows, loaded)
        print(f"goodput: {goodput}", flush=True)
    report = {
        "command": "python -m loadtest.plan_check " + " ".join(sys.argv[1:] if argv is None else argv),
        "profile": args.profile,
        "layout": args.layout,
        "engines": layout.engines,
        "devices": layout.devices,
        "placement": list(layout.placement),
        "sharing": sharing,
        "serving": serving,
        "k": args.k,
        "seeds": args.seeds,
        "phases": rows,
        "goodput": goodput,
    }
    write_report(args.out, "plan_check", report, markdown(report))
    plot(report, args.out / "plan_check.png")
    return report


if __name__ == "__main__":
    main()
