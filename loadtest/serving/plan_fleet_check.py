"""`python -m loadtest.plan_fleet_check`: the fleet model (pdspec/plan/fleet_model.py) beside
the fleet benchmark's measurements (loadtest/serving/fleet_bench.py, through fleet_report),
for the planner's validation on a fleet of shared devices (issue 43's "the H200 fleet of the
routing benchmark"): per layout and QPS level, measured against predicted, and which layout
each ranks first.

    python -m loadtest.plan_fleet_check --report DIR/fleet_report.json --profile h200-qwen3-8b-eagle3 \
      --k 3 --devices 1 --layout 2p2d=kv_aware_prefill --layout colocated-4=colocated_kv_aware \
      --trace sc3x --slo 2000 100 --out DIR

A `--layout SPEC=POLICY` pairs a model layout (plan_check's `layout_of`: `2p2d`,
`colocated-4`, ...) with the fleet_report job that measured it. The fleet model has no
prefix cache, so each level's requests go through it with the prompt tokens the fleet really
computed (`recomputed_tokens` over its requests: what its caches did not hold) and the
trace's output length, at the level's realized rate (its requests over its length), with the
acceptance length its decode workers measured. Measured and predicted: TTFT p50/p90, TPOT
p50; goodput under `--slo`: measured, the job's relaxed-style sustained
goodput as fleet_report computed it for that SLO (`--slo-name`); predicted,
`pdspec.plan.search.evaluate` on the mean computed prompt.

Each engine's KV (`--kv report`, the default) is the fleet's as the report gives it
(`capacity_blocks` of its trace's block size: the benchmark cuts every engine's KV to put the
working set under pressure), not the profile's (`kv_tokens` of an engine given the whole
device: 13x as much on the H100 fleet, 24x on the H200's). The model reserves a request's
computed prompt plus its output, where the fleet held its whole prompt, so the engine's KV is
scaled per level by
(computed + OSL) / (prompt + OSL): as many of the level's requests fit at once as on the fleet.
`--kv profile` keeps the profile's (the checks before 2026-12-06).

`--serving-from-qps Q` takes the profile's serving term (a request's time outside the
engines: the proxy, the legs' round trips, the hand-off) from each layout's own level at Q,
as plan_check's `--serving-from-rate` takes it from a phase: the term of the layout's kind
(disaggregated or aggregated) becomes the one that makes the model's TTFT p50 at that level
the measured (the profile's term plus the difference, never below 0). That level then matches
by construction and the others are the check. Two disaggregated layouts each take their own
(one term per kind in a profile, so each layout's model has its own).

The engines sharing the device slow each other by the profile's device term
(`DeviceSharing`, pdspec/plan/fleet_model.py); `--sharing VALUE` runs with another value of
it, and `--fit-sharing` fits it first (`loadtest.serving.sharing_fit`: a grid over its value
against every layout's levels whose QPS is at most the layout's measured goodput), then
checks with the fitted value and records the fit; `--sharing-form demand` makes either the
demand form's decode demand instead of alpha, `--sharing-form prefill` the prefill form's
prefill_alpha.

Written to `--out`: `plan_fleet_check.json` and `plan_fleet_check.md`. Failure policy: a
report without the trace or a policy named, a layout the model cannot place on
`--devices`, a `--sharing` its form refuses, `--kv report` on a report without its KV size
or a level without its prompt tokens,
or a `--serving-from-qps` that a job has no level at, or given with `--fit-sharing`, stops it
with the reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from loadtest.serving import sharing_fit
from loadtest.serving.plan_check import (
    layout_of,
    load_profile,
    predict,
    with_acceptance,
    with_serving_term,
    write_report,
)
from pdspec.plan.fleet_model import Slo
from pdspec.plan.search import evaluate

# Not throughput: fleet_report's `achieved_rps` is a level's requests over its length in the
# trace (the offered load), the model's is over its makespan (the drain included).
FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms")


def fleet_kv_tokens(report: dict, trace: str) -> int:
    """Tokens of KV each of the fleet's engines held: fleet_report's `capacity_blocks` (the
    smallest engine's, less vLLM's null block) of the trace's block size. SystemExit when the
    report lacks either (one written before fleet_report recorded them)."""
    block_size = (report.get("reference") or {}).get(trace, {}).get("block_size")
    if not report.get("capacity_blocks") or not block_size:
        raise SystemExit(f"the report has no capacity_blocks or {trace} block size: run with --kv profile")
    return int(report["capacity_blocks"]) * int(block_size)


def kv_for_level(profile, kv_tokens: int | None, level: dict, isl: int, osl: int):
    """`profile` with an engine's KV set to the fleet's `kv_tokens`, scaled so that as many of
    the level's requests fit at once as on the fleet: the model reserves ISL (the computed
    prompt) + OSL a request, the fleet held its whole prompt + OSL. None: the profile's.
    SystemExit for a level without its prompt tokens (the scale cannot be taken)."""
    if kv_tokens is None:
        return profile
    if not level.get("prompt_tokens"):
        raise SystemExit(
            f"a level at {level['qps']:g} QPS has no prompt_tokens to scale the fleet's KV by: run with --kv profile"
        )
    held = level["prompt_tokens"] / level["requests"] + osl
    return profile.model_copy(update={"kv_tokens": max(1, round(kv_tokens * (isl + osl) / held))})


def level_rows(
    profile, layout, k: int, summary: dict, osl: int, seeds: int, slo: Slo | None = None, kv_tokens: int | None = None
) -> list[dict]:
    """Each measured level of a fleet_report job beside the model's run of the same load (with
    `slo`, the model's TPOT p90 and attainment too, for `goodput_as_measured`; with
    `kv_tokens`, each engine's KV the fleet's, as `kv_for_level` scales it)."""
    rows = []
    for level in summary["levels"]:
        requests = level["requests"]
        isl = max(1, round(level["recomputed_tokens"] / requests))
        accepted = level.get("acceptance_length") or profile.decode[k].tokens_per_step
        rate = requests / level["duration_s"]
        model = kv_for_level(with_acceptance(profile, k, accepted), kv_tokens, level, isl, osl)
        predicted = predict(model, layout, k, rate, requests, isl, osl, seeds, slo)
        measured = {
            "ttft_p50_ms": level["ttft_ms"]["p50"],
            "ttft_p90_ms": level["ttft_ms"]["p90"],
            "tpot_p50_ms": level["tpot_ms"]["p50"],
        }
        if layout.conditional is not None:  # the proxy's count of each, beside the model's routes
            measured["whole_on_prefill"] = level.get("whole_on_prefill")
            measured["local_prefills"] = level.get("local_prefills")
        rows.append(
            {"qps": level["qps"], "rate": rate, "requests": requests, "isl_computed": isl, "acceptance": accepted}
            | {"duration_s": level["duration_s"], "kv_tokens": model.kv_tokens}
            | {"measured": measured, "predicted": predicted}
        )
    return rows


def serving_from_level(profile, layout, k: int, summary: dict, qps: float, osl: int, seeds: int, kv_tokens):
    """`profile` with the serving term of `layout`'s kind taken from the job's level at `qps`
    (the profile's term, 0 without one, plus that level's measured TTFT p50 less the model's;
    never below 0), and the record of it. SystemExit when the job has no level at `qps`."""
    level = next((lv for lv in summary["levels"] if lv["qps"] == qps), None)
    if level is None:
        have = sorted({lv["qps"] for lv in summary["levels"]})
        raise SystemExit(f"--serving-from-qps {qps:g}: {summary['policy']} has no level at it (it has {have})")
    [row] = level_rows(profile, layout, k, {**summary, "levels": [level]}, osl, seeds, kv_tokens=kv_tokens)
    measured, predicted = row["measured"]["ttft_p50_ms"], row["predicted"]["ttft_p50_ms"]
    source = f"plan_fleet_check --serving-from-qps {qps:g}: {summary['policy']}'s level (TTFT p50 {measured:.1f} ms)"
    served, term = with_serving_term(profile, layout.is_aggregated, measured, predicted, source)
    return served, {"from_qps": qps, **term, "measured_ttft_p50_ms": round(measured, 1)}


def goodput_as_measured(rows: list[dict], slo: Slo) -> float:
    """fleet_report's sustained goodput taken of the model's runs of the same levels (rows of
    `level_rows` with the SLO): the levels in QPS order up to the first whose predicted TTFT p90
    or TPOT p90 is outside the SLO; of the last one before it, the requests meeting both one by
    one over the level's length in the trace; 0 when the first level fails. The levels last a
    few seconds each, so their queues never reach a steady length: this, not the planner's
    steady-state figure, is the one to set beside the measured."""
    held = None
    for row in sorted(rows, key=lambda row: row["qps"]):
        predicted = row["predicted"]
        if predicted["ttft_p90_ms"] > slo.ttft_p90_ms or predicted["tpot_p90_ms"] > slo.tpot_p90_ms:
            break
        held = row
    return held["predicted"]["attainment"] * held["requests"] / held["duration_s"] if held else 0.0


def first_of(layouts: dict, key: str) -> str:
    """The layout with the most goodput by `key`, or "tie: a, b" when several share it (a tie
    is no pick)."""
    best = max(layout["goodput"][key] for layout in layouts.values())
    names = [name for name, layout in layouts.items() if layout["goodput"][key] == best]
    return names[0] if len(names) == 1 else "tie: " + ", ".join(names)


def goodput_measured(summary: dict, slo_name: str) -> float:
    return summary["goodput"][slo_name]["sustained_rps"] or 0.0


def sharing_of(args: argparse.Namespace, profile, measured_layouts: dict) -> tuple:
    """The profile the check runs with and what its device term is: the profile's own,
    `--sharing`'s, or `--fit-sharing`'s: fitted to every layout's levels whose QPS is at most
    the layout's measured goodput (the loads it served within the SLO)."""
    if (given := sharing_fit.unfitted(args, profile, "plan_fleet_check")) is not None:
        return given
    form = args.sharing_form

    def rows_at(value: float) -> list[dict]:
        model = profile.with_sharing(value, "a trial of plan_fleet_check --fit-sharing", form)
        rows = []
        for layout, summary in measured_layouts.values():
            saturation = goodput_measured(summary, args.slo_name)
            levels = level_rows(model, layout, args.k, summary, args.osl, args.seeds, kv_tokens=args.kv_tokens)
            rows += [row for row in levels if row["qps"] <= saturation]
        return rows

    fitted = sharing_fit.fit(rows_at, tuple(args.fit_figures), form=form)
    print(fitted.markdown(), flush=True)
    source = f"fitted by plan_fleet_check --fit-sharing to {args.report}, trace {args.trace}"
    return profile.with_sharing(fitted.value, source, form), sharing_fit.describe(
        form, fitted.value, "--fit-sharing"
    ) | {"fit": fitted.as_dict()}


def markdown(report: dict) -> str:
    lines = [
        f"# The fleet model against the fleet benchmark ({report['profile']}, {report['trace']}, "
        f"{report['devices']} device{'s' if report['devices'] > 1 else ''})",
        "",
        f"`{report['command']}`",
        "",
        f"Goodput under TTFT p90 {report['slo_ms'][0]:g} ms and TPOT p90 {report['slo_ms'][1]:g} ms, measured "
        "(sustained, fleet_report) / predicted (`pdspec.plan.search.evaluate`, the steady rate), and "
        "predicted as measured (the same sustained figure of the model's runs of the same levels):",
        "",
        "| layout | measured by | goodput req/s, measured / predicted | as measured | mean prompt tokens computed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, layout in report["layouts"].items():
        lines.append(
            f"| {name} | {layout['policy']} | {layout['goodput']['measured_rps']:.2f} / "
            f"{layout['goodput']['predicted_rps']:.2f} | {layout['goodput']['predicted_levels_rps']:.2f} | "
            f"{layout['goodput']['isl_computed']:,} |"
        )
    kv = report.get("kv_tokens")
    if kv and kv["from"] == "report":
        lines += [
            "",
            f"Each engine's KV: the fleet's {kv['fleet_engine']:,} tokens (the report's capacity_blocks), scaled per "
            "level by (computed prompt + OSL) / (prompt + OSL); the profile's is "
            f"{kv['profile']:,}.",
        ]
    elif kv:
        lines += ["", f"Each engine's KV: the profile's {kv['profile']:,} tokens (`--kv profile`)."]
    for name, layout in report["layouts"].items():
        if serving := layout.get("serving"):
            lines += [
                "",
                f"{name}: serving term ({serving['kind'].removesuffix('_ms')}) taken from its "
                f"{serving['from_qps']:g} QPS "
                f"level: {serving['term_ms']:g} ms (the profile's {serving['profile_ms']:g} ms; TTFT p50 there "
                f"{serving['measured_ttft_p50_ms']:,.1f} ms measured, {serving['model_ttft_p50_ms_before']:,.1f} ms "
                "modelled with the profile's term)"
                + (": the model is above the measured even without one, so 0." if serving["clamped"] else "."),
            ]
    sharing = report.get("sharing")
    if sharing:
        lines += ["", f"Device sharing {sharing_fit.label(sharing)} ({sharing['from']})."]
        if "fit" in sharing:
            fit = sharing["fit"]
            lines += [
                "",
                "Fitted to each layout's levels of QPS at most its measured goodput: "
                + sharing_fit.from_dict(fit).markdown(),
            ]
    lines += [
        "",
        f"Ranked first: measured **{report['first']['measured']}**, predicted **{report['first']['predicted']}** "
        f"(as measured: **{report['first']['predicted_levels']}**).",
        "",
        "Each cell: measured / predicted (predicted over measured); the model ran each level's "
        f"requests at its realized rate, {report['seeds']} seeds, medians.",
        "",
        "| layout | QPS | requests | prompt tokens computed | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, layout in report["layouts"].items():
        for row in layout["levels"]:
            cells = []
            for figure in FIGURES:
                measured, predicted = row["measured"][figure], row["predicted"][figure]
                ratio = predicted / measured if measured else float("nan")
                cells.append(f"{measured:,.1f} / {predicted:,.1f} ({ratio:.2f})")
            lines.append(
                f"| {name} | {row['qps']:g} | {row['requests']} | {row['isl_computed']:,} | " + " | ".join(cells) + " |"
            )
    conditional = {
        name: layout for name, layout in report["layouts"].items() if "routes" in layout["levels"][0]["predicted"]
    }
    if conditional:
        lines += [
            "",
            "Conditional disaggregation's routes, measured (the proxy's counts) / predicted (the model's, "
            "median over the seeds): requests served whole by a prefill worker (decode_full) and prefilled "
            "by a decode worker (short_prompt and prefill_queue).",
            "",
            "| layout | QPS | requests | whole on a prefill worker | prefilled on a decode worker |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, layout in conditional.items():
            for row in layout["levels"]:
                routes, measured = row["predicted"]["routes"], row["measured"]
                local = routes.get("short_prompt", 0) + routes.get("prefill_queue", 0)
                lines.append(
                    f"| {name} | {row['qps']:g} | {row['requests']} | {_count(measured.get('whole_on_prefill'))} / "
                    f"{routes.get('decode_full', 0):g} | {_count(measured.get('local_prefills'))} / {local:g} |"
                )
    return "\n".join(lines) + "\n"


def _count(value) -> str:
    return "-" if value is None else f"{value:g}"


def plot(report: dict, path: Path) -> None:
    """Each layout's measured (solid, dots) and predicted (dashed) TTFT p50/p90 and TPOT p50
    against the offered QPS, and the goodputs side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = (("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p90_ms", "TTFT p90 ms"), ("tpot_p50_ms", "TPOT p50 ms"))
    fig, axes = plt.subplots(1, len(figures) + 1, figsize=(4.2 * (len(figures) + 1), 3.6))
    names = list(report["layouts"])
    for ax, (figure, label) in zip(axes, figures):
        for index, name in enumerate(names):
            rows = report["layouts"][name]["levels"]
            qps = [row["qps"] for row in rows]
            ax.plot(qps, [row["measured"][figure] for row in rows], "o-", color=f"C{index}", label=f"{name} measured")
            ax.plot(qps, [row["predicted"][figure] for row in rows], "--", color=f"C{index}", label=f"{name} predicted")
        ax.set_xlabel("offered QPS")
        ax.set_title(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    goodput = axes[-1]
    width = 0.38
    for offset, which in ((-width / 2, "measured"), (width / 2, "predicted")):
        values = [report["layouts"][name]["goodput"][f"{which}_rps"] for name in names]
        goodput.bar(
            [i + offset for i in range(len(names))],
            values,
            width,
            label=which,
            hatch="" if which == "measured" else "//",
            color="C7" if which == "measured" else "white",
            edgecolor="black",
        )
    goodput.set_xticks(range(len(names)), names, fontsize=8)
    goodput.set_title(
        f"goodput req/s (TTFT p90 <= {report['slo_ms'][0]:g} ms, TPOT p90 <= {report['slo_ms'][1]:g} ms)", fontsize=8
    )
    goodput.legend(fontsize=7)
    sharing = report.get("sharing")
    fig.suptitle(
        f"The fleet model against the fleet benchmark: {report['trace']}, {Path(report['profile']).name}"
        + (f", {sharing_fit.label(sharing)}" if sharing else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m loadtest.plan_fleet_check", description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, required=True, help="fleet_report.json")
    parser.add_argument("--profile", required=True, help="a shipped profile's name or a file")
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--devices", type=int, required=True, help="the devices the fleet's engines shared")
    parser.add_argument("--layout", action="append", required=True, metavar="SPEC=POLICY")
    parser.add_argument("--trace", required=True, help="the trace (workload) whose jobs to read")
    parser.add_argument("--osl", type=int, default=48, help="output tokens a request (the trace's max_tokens)")
    parser.add_argument("--slo", nargs=2, type=float, default=(2000.0, 100.0), metavar=("TTFT_MS", "TPOT_MS"))
    parser.add_argument("--slo-name", default="relaxed", help="fleet_report's SLO of the same limits")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--serving-from-qps",
        type=float,
        help="take each layout's serving term from its own level at this QPS (that level then matches by "
        "construction); not with --fit-sharing",
    )
    parser.add_argument(
        "--kv",
        choices=("report", "profile"),
        default="report",
        help="each engine's KV: the fleet's (the report's capacity_blocks, scaled per level; the default) "
        "or the profile's kv_tokens",
    )
    sharing_fit.add_arguments(
        parser,
        "fit alpha to each layout's levels of QPS at most its measured goodput "
        "(loadtest.serving.sharing_fit's grid), and check with it",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    profile = load_profile(args.profile, args.k)
    report_in = json.loads(args.report.read_text())
    jobs = {s["policy"]: s for s in report_in["summaries"] if s["workload"] == args.trace}
    slo = Slo(ttft_p90_ms=args.slo[0], tpot_p90_ms=args.slo[1])
    sharing_fit.check_value(args)
    if args.serving_from_qps is not None and args.fit_sharing:
        raise SystemExit("--serving-from-qps with --fit-sharing: fit the device term first, then check with --sharing")
    args.kv_tokens = fleet_kv_tokens(report_in, args.trace) if args.kv == "report" else None
    measured_layouts = {}
    for pair in args.layout:
        spec, _, policy = pair.partition("=")
        if policy not in jobs:
            raise SystemExit(f"{args.report}: no {args.trace}:{policy} job (it has {sorted(jobs)})")
        try:
            measured_layouts[spec] = (layout_of(spec, args.devices), jobs[policy])
        except ValueError as error:
            raise SystemExit(f"cannot model {spec} on {args.devices} devices: {error}") from None
    profile, sharing = sharing_of(args, profile, measured_layouts)
    layouts = {}
    for spec, (layout, summary) in measured_layouts.items():
        served, serving = profile, None
        if args.serving_from_qps is not None:
            served, serving = serving_from_level(
                profile, layout, args.k, summary, args.serving_from_qps, args.osl, args.seeds, args.kv_tokens
            )
        levels = level_rows(served, layout, args.k, summary, args.osl, args.seeds, slo, args.kv_tokens)
        isl = round(statistics.mean(row["isl_computed"] for row in levels))
        accepted = statistics.mean(row["acceptance"] for row in levels)
        steady = with_acceptance(served, args.k, accepted)
        if args.kv_tokens is not None:  # the levels' mean scaling (kv_for_level's, over the job)
            steady = steady.model_copy(update={"kv_tokens": round(statistics.mean(row["kv_tokens"] for row in levels))})
        candidate = evaluate(steady, layout, args.k, [(isl, args.osl)], slo)
        measured = goodput_measured(summary, args.slo_name)
        layouts[spec] = {
            "policy": summary["policy"],
            "serving": serving,
            "levels": levels,
            "goodput": {
                "measured_rps": measured,
                "predicted_rps": round(candidate.goodput_rps, 2),
                "predicted_levels_rps": round(goodput_as_measured(levels, slo), 2),
                "isl_computed": isl,
            },
        }
        print(
            f"{spec} ({summary['policy']}): goodput measured {measured} predicted {candidate.goodput_rps:.2f}",
            flush=True,
        )
    first = {which: first_of(layouts, f"{which}_rps") for which in ("measured", "predicted", "predicted_levels")}
    report = {
        "command": "python -m loadtest.plan_fleet_check " + " ".join(sys.argv[1:] if argv is None else argv),
        "profile": args.profile,
        "trace": args.trace,
        "devices": args.devices,
        "sharing": sharing,
        "kv_tokens": {"from": args.kv, "fleet_engine": args.kv_tokens, "profile": profile.kv_tokens},
        "serving_from_qps": args.serving_from_qps,
        "k": args.k,
        "seeds": args.seeds,
        "slo_ms": list(args.slo),
        "layouts": layouts,
        "first": first,
    }
    write_report(args.out, "plan_fleet_check", report, markdown(report))
    plot(report, args.out / "plan_fleet_check.png")
    return report


if __name__ == "__main__":
    main()
