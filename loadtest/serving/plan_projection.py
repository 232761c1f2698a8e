"""`python -m loadtest.plan_projection`: how the planner's recommendation and its goodput scale
with the fleet's size, for one engine profile and a few workloads (issue 43's projection past
this machine).

    python -m loadtest.plan_projection --profile h200-qwen3-8b-eagle3 --gpus 8 16 32 64 \
      --workload chat:1000:300 --workload rag:8000:200 --slo-ttft-p90-ms 2000 --slo-tpot-p90-ms 50 \
      --acceptance-rate 0.67 --out DIR

For each workload (NAME:ISL:OSL) and fleet size, `pdspec plan`'s search
(`pdspec.plan.search.plan`) with the profile's step times and, given `--acceptance-rate`,
tokens per step from that rate; recorded per size: the recommended layout and K with its
goodput, TTFT p90 and TPOT p90, and the best disaggregated candidate beside it. Written to
`--out`: `projection.json`, `projection.md` (the table, marked as a projection) and
`projection.png` (goodput per GPU against GPUs, a line per workload, the best disaggregated
dashed). Every figure is a prediction of the fleet model from single-engine profiles:
nothing here is a measurement of a fleet. Failure policy: an unknown profile or a
malformed workload stops it before any simulation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pdspec.plan import profile as profiles
from pdspec.plan.fleet_model import Slo
from pdspec.plan.search import Candidate, plan


def workload_of(spec: str) -> tuple[str, int, int]:
    """'chat:1000:300' as (name, ISL, OSL); ValueError otherwise."""
    name, isl, osl = spec.split(":")
    if not name or int(isl) < 1 or int(osl) < 1:
        raise ValueError(f"a workload is NAME:ISL:OSL with ISL, OSL >= 1, got {spec!r}")
    return name, int(isl), int(osl)


def row_of(candidate: Candidate, gpus: int) -> dict:
    summary = candidate.summary
    return {
        "layout": str(candidate.layout),
        "k": candidate.k,
        "goodput_rps": round(candidate.goodput_rps, 2),
        "goodput_per_gpu": round(candidate.goodput_rps / gpus, 3),
        "ttft_p90_ms": round(summary.ttft_ms.p90, 1) if summary else None,
        "tpot_p90_ms": round(summary.tpot_ms.p90, 2) if summary else None,
    }


def project(profile, workloads, gpus: list[int], slo: Slo, requests_per_trial: int, say=print) -> list[dict]:
    rows = []
    for name, isl, osl in workloads:
        for size in gpus:
            started = time.perf_counter()
            result = plan(profile, size, [(isl, osl)], slo, requests_per_trial=requests_per_trial)
            disaggregated = next((c for c in result.ranked if not c.layout.is_aggregated), None)
            rows.append(
                {
                    "workload": name,
                    "isl": isl,
                    "osl": osl,
                    "gpus": size,
                    "best": row_of(result.best, size),
                    "best_disaggregated": row_of(disaggregated, size) if disaggregated else None,
                }
            )
            best = rows[-1]["best"]
            say(
                f"{name} on {size} GPUs: {best['layout']}, K={best['k']}, {best['goodput_rps']} req/s "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    return rows


def markdown(report: dict) -> str:
    lines = [
        f"# Projection: {report['profile']} from {min(report['gpus'])} to {max(report['gpus'])} GPUs",
        "",
        f"`{report['command']}`",
        "",
        "**A projection, not a measurement**: the fleet model's predictions from one engine's measured "
        f"profile ({report['measured']}). SLO: TTFT p90 <= {report['slo_ms'][0]:g} ms, TPOT p90 <= "
        f"{report['slo_ms'][1]:g} ms; draft acceptance rate {report['acceptance_rate'] or 'as measured'}.",
        "",
        "| workload | GPUs | recommended | goodput req/s | per GPU | TTFT p90 ms | TPOT p90 ms "
        "| best disaggregated | its goodput req/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["rows"]:
        best, dis = row["best"], row["best_disaggregated"] or {}
        lines.append(
            f"| {row['workload']} (ISL {row['isl']}, OSL {row['osl']}) | {row['gpus']} | {best['layout']}, "
            f"K={best['k']} | {best['goodput_rps']:g} | {best['goodput_per_gpu']:g} | {best['ttft_p90_ms']} | "
            f"{best['tpot_p90_ms']} | {dis.get('layout', '-')}, K={dis.get('k', '-')} | {dis.get('goodput_rps', '-')} |"
        )
    return "\n".join(lines) + "\n"


def draw(report: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    for name in dict.fromkeys(row["workload"] for row in report["rows"]):
        rows = [row for row in report["rows"] if row["workload"] == name]
        line = axes.plot(
            [r["gpus"] for r in rows], [r["best"]["goodput_per_gpu"] for r in rows], marker="o", label=f"{name}: best"
        )[0]
        dis = [r for r in rows if r["best_disaggregated"]]
        axes.plot(
            [r["gpus"] for r in dis],
            [r["best_disaggregated"]["goodput_per_gpu"] for r in dis],
            marker="x",
            linestyle="--",
            color=line.get_color(),
            label=f"{name}: best disaggregated",
        )
    axes.set_xscale("log", base=2)
    axes.set_xlabel("GPUs (one engine each)")
    axes.set_ylabel("predicted goodput per GPU (req/s)")
    axes.set_ylim(bottom=0)
    axes.set_title(f"Projection from {report['profile']} (not a measurement)", fontsize=9)
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m loadtest.plan_projection", description=__doc__)
    parser.add_argument("--profile", required=True, help="a shipped profile's name or a profile file")
    parser.add_argument("--gpus", type=int, nargs="+", required=True)
    parser.add_argument("--workload", action="append", required=True, help="NAME:ISL:OSL (repeat)")
    parser.add_argument("--slo-ttft-p90-ms", type=float, required=True)
    parser.add_argument("--slo-tpot-p90-ms", type=float, required=True)
    parser.add_argument("--acceptance-rate", type=float, help="as pdspec plan --acceptance_rate")
    parser.add_argument("--requests-per-trial", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        shipped = profiles.shipped()
        engine = profiles.load(shipped.get(args.profile) or Path(args.profile))
        workloads = [workload_of(spec) for spec in args.workload]
        if args.acceptance_rate is not None:
            engine = engine.with_acceptance(args.acceptance_rate)
    except (profiles.ProfileError, ValueError) as exc:
        raise SystemExit(f"plan_projection: {exc}") from None
    slo = Slo(ttft_p90_ms=args.slo_ttft_p90_ms, tpot_p90_ms=args.slo_tpot_p90_ms)
    rows = project(engine, workloads, sorted(args.gpus), slo, args.requests_per_trial)
    report = {
        "command": "python -m loadtest.plan_projection " + " ".join(sys.argv[1:] if argv is None else argv),
        "profile": args.profile,
        "measured": engine.measured.split(":")[0],
        "gpus": sorted(args.gpus),
        "slo_ms": [args.slo_ttft_p90_ms, args.slo_tpot_p90_ms],
        "acceptance_rate": args.acceptance_rate,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "projection.json").write_text(json.dumps(report, indent=2))
    (args.out / "projection.md").write_text(markdown(report))
    draw(report, args.out / "projection.png")
    print(f"wrote {args.out}/projection.{{json,md,png}}")
    return report


if __name__ == "__main__":
    main()
