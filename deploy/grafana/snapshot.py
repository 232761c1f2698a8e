"""A picture of the Grafana dashboard without Grafana: `python -m deploy.grafana.snapshot
--prometheus URL --out DIR [--minutes 15]`.

Runs the dashboard's own expressions (deploy/grafana/pdspec-dashboard.json, variables set
to "All") as range queries over the window and draws its time-series panels, in the
dashboard's order, as one PNG (`DIR/dashboard.png`), with the series it read
(`DIR/dashboard.json`), for the README and benchmark reports.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy.prometheus.promql import DASHBOARD, Prometheus, load_dashboard, substitute

COLUMNS = 3


@dataclass
class PanelData:
    title: str
    unit: str
    row: str
    series: list[dict] = field(default_factory=list)  # {"label", "t": [...], "v": [...]}


def legend(template: str, labels: dict) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    import re

    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()
    return text or json.dumps(labels, sort_keys=True)


def rate_interval(step_s: float, scrape_s: float) -> str:
    """Grafana's $__rate_interval: max(step + scrape interval, 4 x scrape interval)."""
    return f"{int(max(step_s + scrape_s, 4 * scrape_s))}s"


def collect(
    prom: Prometheus, dashboard: dict, start: float, end: float, step: float, scrape_s: float
) -> list[PanelData]:
    panels, row = [], ""
    window = f"{int(end - start)}s"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        if panel["type"] != "timeseries":
            continue
        data = PanelData(panel["title"], panel["fieldConfig"]["defaults"].get("unit", ""), row)
        for target in panel["targets"]:
            expr = substitute(target["expr"], rate_interval(step, scrape_s), window)
            for result in prom.query_range(expr, start, end, step):
                points = [(float(t), float(v)) for t, v in result["values"]]
                data.series.append(
                    {
                        "label": legend(target.get("legendFormat", ""), result["metric"]),
                        "t": [t - end for t, _ in points],
                        "v": [v for _, v in points],
                    }
                )
        panels.append(data)
    return panels


def draw(panels: list[PanelData], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = math.ceil(len(panels) / COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(6 * COLUMNS, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        scale = 100 if panel.unit == "percentunit" else 1
        for series in panel.series:
            values = [v * scale if math.isfinite(v) else math.nan for v in series["v"]]
            ax.plot([t / 60 for t in series["t"]], values, label=series["label"], linewidth=1.2)
        unit = {"percentunit": "%", "s": "s", "Bps": "bytes/s", "ops": "/s", "reqps": "req/s"}.get(panel.unit, "")
        ax.set_title(f"{panel.title}" + (f" ({unit})" if unit else ""), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("minutes before the end of the window", fontsize=7)
        if panel.series:
            ax.legend(fontsize=6, loc="best")
        else:
            ax.text(
                0.5,
                0.5,
                "no data in this window",
                ha="center",
                va="center",
                fontsize=8,
                color="gray",
                transform=ax.transAxes,
            )
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=80)
    plt.close(fig)


def snapshot(
    prometheus_url: str, out_dir: Path, minutes: float, step_s: float = 0, scrape_s: float = 5, end: float | None = None
) -> list[PanelData]:
    end = end or time.time()
    start = end - minutes * 60
    step = step_s or max(1.0, minutes * 60 / 240)
    prom = Prometheus(prometheus_url)
    try:
        panels = collect(prom, load_dashboard(DASHBOARD), start, end, step, scrape_s)
    finally:
        prom.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(end))
    draw(panels, out_dir / "dashboard.png", f"pdspec dashboard, {minutes:g} minutes to {stamp}")
    (out_dir / "dashboard.json").write_text(
        json.dumps(
            {
                "prometheus": prometheus_url,
                "start": start,
                "end": end,
                "step_s": step,
                "panels": [{"title": p.title, "row": p.row, "unit": p.unit, "series": p.series} for p in panels],
            },
        )
        + "\n"
    )
    return panels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--out", type=Path, required=True, help="folder for dashboard.png and dashboard.json")
    parser.add_argument("--minutes", type=float, default=15, help="window ending now")
    parser.add_argument("--step", type=float, default=0, help="seconds between points (default: window/240)")
    parser.add_argument("--scrape-interval", type=float, default=5, help="Prometheus's, for $__rate_interval")
    args = parser.parse_args()
    panels = snapshot(args.prometheus, args.out, args.minutes, args.step, args.scrape_interval)
    empty = [p.title for p in panels if not p.series]
    print(f"wrote {args.out / 'dashboard.png'}: {len(panels)} panels, {len(panels) - len(empty)} with data")
    if empty:
        print("no data: " + "; ".join(empty))


if __name__ == "__main__":
    main()
