"""The in_core_worker A/B of `pdspec bench --workload cpu-in-core` (bench.json here): per arm
the stacks' start and their latency per load level, and each round's ratio of the two arms
(in_core over worker_process; a round is one stack of each, started one after the other).

    python loadtest/results/in_core_worker/cpu-1p1d/summarize.py loadtest/results/in_core_worker/cpu-1p1d

Writes summary.md and summary.png beside bench.json. The first stack's start, which fills
the shared engine cache, is left out of the start figures."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ARMS = ("in_core", "worker_process")
METRICS = (("ttft_ms", "median"), ("ttft_ms", "p99"), ("itl_ms", "median"), ("tpot_ms", "median"))


def arm_of(name: str) -> str:
    """`local.in_core_2` -> `in_core` (pdspec bench names a stack profile.variant)."""
    return name.rsplit(".", 1)[-1].rsplit("_", 1)[0]


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):,.1f} [{min(values):,.1f}-{max(values):,.1f}]"


def main(folder: Path) -> None:
    bench = json.loads((folder / "bench.json").read_text())
    stacks = [s for s in bench["stacks"] if s.get("report")]
    first = bench["stacks"][0]["name"]
    by_arm = {arm: [s for s in stacks if arm_of(s["name"]) == arm] for arm in ARMS}
    rounds = sorted({s["name"].rsplit("_", 1)[1] for s in stacks})
    loads = [p["load"] for p in stacks[0]["report"]["phases"]]

    def value(stack: dict, load: str, metric: str, stat: str) -> float:
        (phase,) = [p for p in stack["report"]["phases"] if p["load"] == load]
        return phase[metric][stat]

    lines = [f"`{bench['command']}`", "", "Mean [min-max] over the stacks of each arm.", ""]
    lines += ["| | " + " | ".join(ARMS) + " | in_core / worker_process by round |", "| --- | --- | --- | --- |"]
    ready = {arm: [s["ready_s"] for s in by_arm[arm] if s["name"] != first] for arm in ARMS}
    pairs = []
    for r in rounds:
        a, b = ([s for s in by_arm[arm] if s["name"].endswith("_" + r)] for arm in ARMS)
        if a and b and first not in (a[0]["name"], b[0]["name"]):
            pairs.append(a[0]["ready_s"] / b[0]["ready_s"])
    lines.append(
        f"| ready (s, the first stack left out) | {spread(ready['in_core'])} | {spread(ready['worker_process'])} "
        f"| {', '.join(f'{x:.2f}' for x in pairs)} |"
    )
    figures = {}
    for load in loads:
        for metric, stat in METRICS:
            per_arm = {arm: [value(s, load, metric, stat) for s in by_arm[arm]] for arm in ARMS}
            ratios = []
            for r in rounds:
                a, b = ([s for s in by_arm[arm] if s["name"].endswith("_" + r)] for arm in ARMS)
                if a and b:
                    ratios.append(value(a[0], load, metric, stat) / value(b[0], load, metric, stat))
            figures[(load, metric, stat)] = per_arm
            lines.append(
                f"| {load}: {metric} {stat} | {spread(per_arm['in_core'])} | {spread(per_arm['worker_process'])} "
                f"| {', '.join(f'{x:.2f}' for x in ratios)} |"
            )
    (folder / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("ready (s)", ready)] + [
        (f"{load}\n{metric} {stat}", figures[(load, metric, stat)])
        for load in loads
        for metric, stat in (("ttft_ms", "median"), ("itl_ms", "median"))
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4))
    for ax, (title, per_arm) in zip(axes, panels):
        for x, arm in enumerate(ARMS):
            ax.bar(x, statistics.mean(per_arm[arm]), color=("tab:blue", "tab:gray")[x], alpha=0.6)
            ax.scatter([x] * len(per_arm[arm]), per_arm[arm], color="black", s=12, zorder=3)
        ax.set_xticks(range(len(ARMS)), ARMS, fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.suptitle("in_core_worker on the CPU 1P1D: bars the mean, dots each stack", fontsize=10)
    fig.tight_layout()
    fig.savefig(folder / "summary.png", dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
