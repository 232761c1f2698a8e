"""The fleet model with conditional disaggregation against the H100 fleet calls, summed up:
per modelled layout, the mean absolute log ratio of predicted to measured TTFT p50/p90 and TPOT
p50 over every level of every call that ran it (as a factor, and the bias: the geometric mean of
predicted over measured), the requests served whole on a prefill worker and prefilled on a
decode worker, measured (the proxy's counts) against predicted (the model's routes), and each
call's goodput and first pick.

    python loadtest/results/plan/check-h100-fleet/conditional/summary.py   # writes summary.md here

Reads `call-*/plan_fleet_check.json` (written by `python -m loadtest.plan_fleet_check`, the
commands in README.md).
"""

import json
import math
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms")


def calls() -> list[tuple[str, dict]]:
    paths = sorted(HERE.glob("call-*/plan_fleet_check.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    return [(path.parent.name, json.loads(path.read_text())) for path in paths]


def factor(logs: list[float]) -> str:
    mean_abs = statistics.mean(abs(x) for x in logs)
    return f"x{math.exp(mean_abs):.2f} (bias x{math.exp(statistics.mean(logs)):.2f})"


def main() -> None:
    logs: dict[str, dict[str, list[float]]] = {}
    routes: dict[str, list[int]] = {}
    picks = []
    for call, report in calls():
        for name, layout in report["layouts"].items():
            for row in layout["levels"]:
                for figure in FIGURES:
                    ratio = row["predicted"][figure] / row["measured"][figure]
                    logs.setdefault(name, {}).setdefault(figure, []).append(math.log(ratio))
                if "routes" in row["predicted"]:
                    predicted, measured = row["predicted"]["routes"], row["measured"]
                    local = predicted.get("short_prompt", 0) + predicted.get("prefill_queue", 0)
                    counts = routes.setdefault(name, [0, 0, 0, 0])
                    counts[0] += measured["whole_on_prefill"]
                    counts[1] += predicted.get("decode_full", 0)
                    counts[2] += measured["local_prefills"]
                    counts[3] += local
        goodputs = ", ".join(
            f"{name} {layout['goodput']['measured_rps']:.2f} / {layout['goodput']['predicted_rps']:.2f} / "
            f"{layout['goodput']['predicted_levels_rps']:.2f}"
            for name, layout in report["layouts"].items()
        )
        first = report["first"]
        picks.append(
            f"| {call} | {goodputs} | {first['measured']} | {first['predicted']} | {first['predicted_levels']} |"
        )
    lines = [
        "Predicted over measured, every level of every call (mean absolute log ratio as a factor; bias: "
        "the geometric mean of predicted / measured):",
        "",
        "| layout | levels | TTFT p50 | TTFT p90 | TPOT p50 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, by_figure in logs.items():
        cells = " | ".join(factor(by_figure[figure]) for figure in FIGURES)
        lines.append(f"| {name} | {len(by_figure['ttft_p90_ms'])} | {cells} |")
    lines += [
        "",
        "Conditional disaggregation's routes, summed over the levels (measured / predicted):",
        "",
        "| layout | whole on a prefill worker | prefilled on a decode worker |",
        "| --- | --- | --- |",
    ]
    for name, (whole_m, whole_p, local_m, local_p) in routes.items():
        lines.append(f"| {name} | {whole_m:g} / {whole_p:g} | {local_m:g} / {local_p:g} |")
    lines += [
        "",
        "Goodput under TTFT p90 2 s, TPOT p90 100 ms (measured / predicted steady / predicted as measured) "
        "and the layout each ranks first:",
        "",
        "| call | goodput req/s | first, measured | predicted | as measured |",
        "| --- | --- | --- | --- | --- |",
        *picks,
    ]
    (HERE / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
