"""The proxy race's figures (loadtest/micro/proxy_race.py): each point's mean and spread
per contender, pdspec / router ratios, the markdown tables and the plot.

A point is (pairing, shape, connections). Its figures per contender are the mean and the
min..max of its runs' req/s, p50 and p99; runs wrk could not report a figure for are left
out of that figure. A run is flagged when wrk counted any error (status >= 400, socket
errors) or reported no rate; a point with a flagged run says so in its row, and its
figures stand only for what completed. Ratios are pdspec's mean over the router's: above
1 pdspec serves more requests a second, below 1 its latency is lower.
"""

from __future__ import annotations

import statistics
from pathlib import Path

PDSPEC, ROUTER = "pdspec", "vllm-router"
METRICS = ("rps", "p50_ms", "p99_ms")


def flagged(run: dict) -> bool:
    """A run whose figures cannot be trusted whole: wrk counted errors, or gave no rate."""
    return bool(run.get("errors")) or not run.get("rps")


def spread(values: list[float]) -> dict | None:
    """Mean and min..max of a figure's values (None when there are none)."""
    if not values:
        return None
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: list[dict]) -> list[dict]:
    """One entry per point, in the order its first run ran: each contender's spread of
    every metric, its errors and flagged runs, its CPU use; and pdspec / router ratios."""
    points: dict[tuple, dict[str, list[dict]]] = {}
    for run in runs:
        key = (run["pairing"], run["shape"], run["connections"])
        points.setdefault(key, {}).setdefault(run["contender"], []).append(run)
    summary = []
    for (pairing, shape, connections), by_contender in points.items():
        contenders = {}
        for contender, its_runs in by_contender.items():
            figures = {metric: spread([r[metric] for r in its_runs if r.get(metric) is not None]) for metric in METRICS}
            contenders[contender] = {
                "runs": len(its_runs),
                **figures,
                "errors": sum(r.get("errors") or 0 for r in its_runs),
                "flagged_runs": sum(flagged(r) for r in its_runs),
                "proxy_cpu": mean_of(its_runs, "proxy_cpu"),
                "load_cores_busy_max": max_of(its_runs, "load_cores_busy"),
            }
        summary.append(
            {
                "pairing": pairing,
                "shape": shape,
                "connections": connections,
                "contenders": contenders,
                "ratios": ratios(contenders),
            }
        )
    return summary


def ratios(contenders: dict) -> dict:
    """pdspec's mean over the router's, per metric (None where either has no figure)."""
    out = {}
    for metric in METRICS:
        ours, theirs = (contenders.get(name, {}).get(metric) for name in (PDSPEC, ROUTER))
        out[metric] = ours["mean"] / theirs["mean"] if ours and theirs and theirs["mean"] else None
    return out


def mean_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def max_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return max(values) if values else None


def worker_calls(runs: list[dict]) -> dict[tuple[str, str, str], dict[str, float]]:
    """The calls the workers answered per request, mean over runs, per (pairing, shape,
    contender): {"decode.tokenize": 1.0, ...}; a kind a run did not see counts 0 in it."""
    by_key: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for run in runs:
        flat = {
            f"{role}.{kind}": value
            for role, kinds in (run.get("worker_calls_per_request") or {}).items()
            for kind, value in kinds.items()
        }
        by_key.setdefault((run["pairing"], run["shape"], run["contender"]), []).append(flat)
    calls = {}
    for key, flats in by_key.items():
        names = sorted({name for flat in flats for name in flat})
        calls[key] = {name: statistics.fmean(flat.get(name, 0.0) for flat in flats) for name in names}
    return calls


# --- text -----------------------------------------------------------------------------


def progress_line(run: dict) -> str:
    """One run as the race prints it while it goes."""
    rps = f"{run['rps']:,.0f} req/s" if run.get("rps") is not None else "no rate"
    latency = " ".join(
        f"{name} {run[key]:.2f} ms" for name, key in (("p50", "p50_ms"), ("p99", "p99_ms")) if run.get(key) is not None
    )
    cpu = f", proxy CPU {run['proxy_cpu']:.0%}" if run.get("proxy_cpu") is not None else ""
    flag = "  FLAGGED" if flagged(run) else ""
    return (
        f"round {run['round'] + 1} {run['pairing']} {run['shape']} c={run['connections']} {run['contender']}: "
        f"{rps}, {latency}, errors {run.get('errors', '?')}{cpu}{flag}"
    )


def figure(stats: dict | None, digits: int) -> str:
    if not stats:
        return "-"
    if stats["n"] == 1:
        return f"{stats['mean']:,.{digits}f}"
    return f"{stats['mean']:,.{digits}f} ({stats['min']:,.{digits}f}..{stats['max']:,.{digits}f})"


def ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def percent(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def markdown(report: dict) -> str:
    """The race as markdown: how it ran, one table per pairing and shape, the workers' calls."""
    config = report["config"]
    lines = [
        "# The proxy race: pdspec against vllm-router",
        "",
        f"`{report['command']}` ({report['started']}; vllm-router {config.get('router_version') or '?'}; "
        f"{config['rounds']} round(s) of {config['seconds']:g} s a run; proxies on CPU {config['proxy_cpus']}, "
        f"wrk and the workers on CPU {config['load_cpus']}; load average at the start "
        f"{', '.join(f'{x:.2f}' for x in config['load_average_at_start'])}).",
        "",
        f"Prompts: {config['prompts']} texts of {prompt_words(config['prompt_tokens'])} words "
        "(one instant-worker token each), "
        f"sent in turn; streamed replies of {config['stream_tokens']} token events. Figures: mean (min..max) over "
        "the rounds; ratios are pdspec / router (req/s above 1: pdspec faster; latency below 1: pdspec lower). "
        "Proxy CPU: the proxy process's CPU time over the run's wall time (1 = one core); load cores: their busy "
        "share in the busiest run (near 100%, wrk and the workers may have set the pace).",
    ]
    points = report["summary"]
    for pairing in config["pairings"]:
        for shape in config["shapes"]:
            rows = [p for p in points if p["pairing"] == pairing and p["shape"] == shape]
            if not rows:
                continue
            label = config["pairings"][pairing]["label"]
            lines += [
                "",
                f"## {label}, {shape}",
                "",
                "| connections | pdspec req/s | router req/s | req/s ratio | pdspec p50 ms | router p50 ms | p50 ratio "
                "| pdspec p99 ms | router p99 ms | p99 ratio | proxy CPU pdspec / router | load cores | errors |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for point in rows:
                ours = point["contenders"].get(PDSPEC, {})
                theirs = point["contenders"].get(ROUTER, {})
                busy = [
                    c.get("load_cores_busy_max") for c in (ours, theirs) if c.get("load_cores_busy_max") is not None
                ]
                lines.append(
                    f"| {point['connections']} | {figure(ours.get('rps'), 0)} | {figure(theirs.get('rps'), 0)} "
                    f"| {ratio(point['ratios']['rps'])} | {figure(ours.get('p50_ms'), 2)} "
                    f"| {figure(theirs.get('p50_ms'), 2)} | {ratio(point['ratios']['p50_ms'])} "
                    f"| {figure(ours.get('p99_ms'), 2)} | {figure(theirs.get('p99_ms'), 2)} "
                    f"| {ratio(point['ratios']['p99_ms'])} "
                    f"| {percent(ours.get('proxy_cpu'))} / {percent(theirs.get('proxy_cpu'))} "
                    f"| {percent(max(busy) if busy else None)} | {errors_cell(ours, theirs)} |"
                )
    calls = worker_calls(report["runs"])
    if calls:
        lines += [
            "",
            "## Calls on the workers per request",
            "",
            "What each proxy asked of the workers: their POSTs over each run (/stats) per completed request, mean "
            "over the runs; `decode.tokenize` is pdspec's /tokenize, `*.render` the router's /v1/completions/render.",
            "",
            "| pairing | shape | contender | calls |",
            "| --- | --- | --- | --- |",
        ]
        for (pairing, shape, contender), kinds in calls.items():
            listed = ", ".join(f"{name} {value:.2f}" for name, value in kinds.items()) or "-"
            lines.append(f"| {pairing} | {shape} | {contender} | {listed} |")
    return "\n".join(lines) + "\n"


def errors_cell(ours: dict, theirs: dict) -> str:
    """0, or each contender's error count and flagged runs: a row whose figures are partial."""
    parts = [
        f"{name}: {c['errors']} in {c['flagged_runs']}/{c['runs']} runs **FLAGGED**"
        for name, c in ((PDSPEC, ours), (ROUTER, theirs))
        if c and c.get("flagged_runs")
    ]
    return "; ".join(parts) or "0"


# --- the plot ---------------------------------------------------------------------------


def plot(report: dict, path: Path) -> bool:
    """req/s against connections, one panel per pairing and shape, pdspec and the router
    with their min..max as error bars. False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing (pip install matplotlib): no plot", flush=True)
        return False
    config = report["config"]
    pairings, shapes = list(config["pairings"]), config["shapes"]
    fig, axes = plt.subplots(len(pairings), len(shapes), figsize=(5.5 * len(shapes), 4 * len(pairings)), squeeze=False)
    colors = {PDSPEC: "tab:blue", ROUTER: "tab:orange"}
    for row, pairing in enumerate(pairings):
        for col, shape in enumerate(shapes):
            ax = axes[row][col]
            points = [p for p in report["summary"] if p["pairing"] == pairing and p["shape"] == shape]
            for contender, color in colors.items():
                shown = [(p["connections"], p["contenders"].get(contender, {}).get("rps")) for p in points]
                shown = [(c, s) for c, s in shown if s]
                if not shown:
                    continue
                x = [c for c, _ in shown]
                y = [s["mean"] for _, s in shown]
                below = [s["mean"] - s["min"] for _, s in shown]
                above = [s["max"] - s["mean"] for _, s in shown]
                ax.errorbar(x, y, yerr=[below, above], label=contender, color=color, marker="o", capsize=4)
            ax.set_xscale("log", base=2)
            ax.set_xticks(config["connections"], [str(c) for c in config["connections"]])
            ax.set_ylim(bottom=0)
            ax.set_xlabel("connections")
            ax.set_ylabel(f"requests/s (proxy on CPU {config['proxy_cpus']})")
            ax.set_title(f"{config['pairings'][pairing]['label']}\n{shape}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"proxy race: mean of {config['rounds']} round(s), bars min..max", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def prompt_words(prompt_tokens: int | dict[str, int]) -> str:
    """The prompts' length: one for every pairing, or each pairing's."""
    if isinstance(prompt_tokens, int):
        return f"{prompt_tokens:,}"
    return ", ".join(f"{words:,} ({pairing})" for pairing, words in prompt_tokens.items())
