"""Layouts on the H100 (calls 1-8): the same four engines as 2P2D, 3P1D and 1P3D, each policy's
sc3x figures per QPS as mean [min-max] over the calls that ran it, and one plot. (Calls 9-12,
the routing policies of always-disaggregated 2P2D, are `policies.py`'s.)

    python loadtest/results/fleet/h100-qwen3-8b/layouts.py

Reads each `call-*/fleet_report.json` (written by `python -m loadtest.fleet_report`), groups
the runs by layout (the fleet's prefill workers out of four; colocated_kv_aware runs every
worker whole whatever the layout, so its runs are pooled), and writes `layouts.md` and
`layouts.png` here. The relaxed SLO (TTFT p90 <= 2 s, TPOT p90 <= 100 ms) is the one that
tells the policies apart on this card (no policy keeps TPOT p90 under the strict 50 ms past
2 QPS).
"""

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
LAYOUT = {1: "1P3D", 2: "2P2D", 3: "3P1D"}
SLO = "relaxed"
CALLS = range(1, 9)


def runs(calls=CALLS) -> dict[tuple[str, str], list[dict]]:
    """(layout, policy) -> that pair's sc3x summaries, one per call of `calls`, in call order."""
    out: dict[tuple[str, str], list[dict]] = {}
    for call in calls:
        path = HERE / f"call-{call}" / "fleet_report.json"
        report = json.loads(path.read_text())
        layout = LAYOUT[report["prefill_workers"]]
        for summary in report["summaries"]:
            if summary["workload"] != "sc3x":
                continue
            policy = summary["policy"]
            key = ("any", policy) if policy == "colocated_kv_aware" else (layout, policy)
            out.setdefault(key, []).append(summary | {"call": path.parent.name})
    return out


def levels(summary: dict) -> list[dict]:
    """The measured levels (no warm-up), in the trace's order: the same QPS at each index in
    every run of sc3x, which the tables and plot pair by index."""
    return [lv for lv in summary["levels"] if lv["phase"].startswith("level")]


def goodput(summary: dict) -> float:
    """fleet_report's goodput: requests/s that met the SLO at the highest level whose p90s are
    inside it."""
    return summary["goodput"][SLO]["rps"] or 0.0


def spread(values: list[float], digits: int = 0) -> str:
    mean = statistics.mean(values)
    if len(values) == 1:
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


def main() -> None:
    table = runs()
    lines = [
        "| layout | policy | runs (calls) | goodput relaxed |",
        "| --- | --- | --- | --- |",
    ]
    for (layout, policy), summaries in table.items():
        calls = ", ".join(s["call"].removeprefix("call-") for s in summaries)
        lines.append(
            f"| {layout} | {policy} | {len(summaries)} ({calls}) | {spread([goodput(s) for s in summaries], 2)} |"
        )
    lines += [
        "",
        "| layout | policy | QPS | TTFT p50 ms | TTFT p90 ms | TPOT p90 ms | relaxed SLO-met rps | local prefills | whole on a prefill worker | cut |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (layout, policy), summaries in table.items():
        for i, first in enumerate(levels(summaries[0])):
            lv = [levels(s)[i] for s in summaries]
            lines.append(
                f"| {layout} | {policy} | {first['qps']:g} | {spread([x['ttft_ms']['p50'] for x in lv])} "
                f"| {spread([x['ttft_ms']['p90'] for x in lv])} | {spread([x['tpot_ms']['p90'] for x in lv], 1)} "
                f"| {spread([x['slo'][SLO]['slo_rps'] for x in lv], 2)} | {spread([x['local_prefills'] for x in lv], 1)} "
                f"| {spread([x['whole_on_prefill'] for x in lv], 1)} | {sum(x['cut'] for x in lv)} |"
            )
    (HERE / "layouts.md").write_text("\n".join(lines) + "\n")

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for (layout, policy), summaries in table.items():
        qps = [lv["qps"] for lv in levels(summaries[0])]
        label = (
            f"{policy} ({layout}, {len(summaries)} runs)" if layout != "any" else f"{policy} ({len(summaries)} runs)"
        )
        style = "--" if policy == "colocated_kv_aware" else "-"
        for axis, pick in (
            (left, lambda lv: lv["slo"][SLO]["slo_rps"]),
            (right, lambda lv: lv["ttft_ms"]["p90"] / 1000),
        ):
            per_level = [[pick(levels(s)[i]) for s in summaries] for i in range(len(qps))]
            mean = [statistics.mean(v) for v in per_level]
            axis.plot(qps, mean, style, marker="o", label=label)
            axis.fill_between(qps, [min(v) for v in per_level], [max(v) for v in per_level], alpha=0.15)
    left.set(xlabel="offered QPS (sc3x)", ylabel="requests/s meeting TTFT p90 <= 2 s, TPOT p90 <= 100 ms")
    left.set_title("SLO-met rate by layout (mean, band = min-max)")
    right.set(xlabel="offered QPS (sc3x)", ylabel="TTFT p90 (s)", yscale="log")
    right.axhline(2.0, color="grey", lw=0.8)
    right.set_title("TTFT p90 (2 s SLO line)")
    left.legend(fontsize=7)
    fig.suptitle("Four Qwen3-8B-shape engines on one H100: 2P2D, 3P1D, 1P3D and colocated")
    fig.tight_layout()
    fig.savefig(HERE / "layouts.png", dpi=110)


if __name__ == "__main__":
    main()
