"""Routing benchmark runs side by side: TTFT (median, p90) of every (workload, policy) in
each run, one bar per run, as a plot and a markdown table.

    python -m loadtest.routing_compare --out loadtest/results/routing/engine-fix.png \
      before=loadtest/results/routing/A/routing_bench.json after=loadtest/results/routing/B/routing_bench.json

The runs should share their workload settings (the table shows each run's command).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def load(specs: list[str]) -> dict[str, dict]:
    """LABEL=PATH pairs, in order, to their reports."""
    runs = {}
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"expected LABEL=PATH, got {spec!r}")
        runs[label] = json.loads(Path(path).read_text())
    return runs


def rows(runs: dict[str, dict]) -> list[tuple[str, str, dict[str, dict]]]:
    """(workload, policy, {label: run}) for every pair any report has, in first-seen order."""
    seen: dict[tuple[str, str], dict[str, dict]] = {}
    for label, report in runs.items():
        for run in report["runs"]:
            seen.setdefault((run["workload"], run["policy"]), {})[label] = run
    return [(workload, policy, by_label) for (workload, policy), by_label in seen.items()]


def markdown(runs: dict[str, dict]) -> str:
    labels = list(runs)
    lines = [f"- {label}: `{report['command']}`" for label, report in runs.items()]
    lines += [
        "",
        "| workload | policy | " + " | ".join(f"{label}: TTFT p50 / p90 ms, prefill hit" for label in labels) + " |",
        "|" + " --- |" * (2 + len(labels)),
    ]
    for workload, policy, by_label in rows(runs):
        cells = []
        for label in labels:
            run = by_label.get(label)
            ttft = (run or {}).get("ttft_ms") or {}
            cells.append(
                "-"
                if run is None
                else f"{ttft.get('median', 0):.0f} / {ttft.get('p90', 0):.0f}, {run['prefill_hit_rate']:.2f}"
            )
        lines.append(f"| {workload} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(runs)
    table = rows(runs)
    workloads = list(dict.fromkeys(workload for workload, _, _ in table))
    fig, axes = plt.subplots(len(workloads), 1, figsize=(11, 3.4 * len(workloads)), squeeze=False)
    width = 0.8 / len(labels)
    for ax, workload in zip(axes[:, 0], workloads):
        entries = [(policy, by_label) for w, policy, by_label in table if w == workload]
        x = np.arange(len(entries))
        for i, label in enumerate(labels):
            p90 = [((by_label.get(label) or {}).get("ttft_ms") or {}).get("p90", 0) for _, by_label in entries]
            p50 = [((by_label.get(label) or {}).get("ttft_ms") or {}).get("median", 0) for _, by_label in entries]
            bars = ax.bar(x + (i - (len(labels) - 1) / 2) * width, p90, width, label=f"{label}: p90")
            ax.scatter(
                x + (i - (len(labels) - 1) / 2) * width,
                p50,
                color="k",
                marker="_",
                s=120,
                zorder=3,
                label="median" if i == 0 else None,
            )
            ax.bar_label(bars, fmt="%.0f", fontsize=6)
        ax.set_xticks(x, [policy.replace("_", "\n") for policy, _ in entries], fontsize=8)
        ax.set_ylabel("TTFT ms")
        ax.set_title(f"{workload}: TTFT p90 (bars) and median (marks)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.routing_compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="the plot (PNG); the table goes beside it (.md)")
    parser.add_argument("runs", nargs="+", metavar="LABEL=PATH", help="a routing_bench.json and its label")
    args = parser.parse_args(argv)
    runs = load(args.runs)
    text = markdown(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, args.out)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
