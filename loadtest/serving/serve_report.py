"""serve_bench's outputs: the A/B summary, a markdown table, PNG plots, the JSON file."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def ab_summary(phases: list[dict]) -> list[dict]:
    """Per load level: prefill tokens/s with `always` and `auto` (mean over phases), the
    difference, each interleaved pair's ratio (spread), and K=0 proposals / proposals."""
    rows = []
    for load in dict.fromkeys(p["load"] for p in phases):
        of = {policy: [p for p in phases if p["load"] == load and p["policy"] == policy] for policy in ("auto", "always")}
        if not of["auto"] or not of["always"]:
            continue
        rate = {k: [p["prefill_tokens_per_s"] or 0.0 for p in v] for k, v in of.items()}
        auto, always = statistics.mean(rate["auto"]), statistics.mean(rate["always"])
        pairs = [a / b for a, b in zip(rate["auto"], rate["always"]) if b]
        rows.append({
            "load": load,
            "phases_per_policy": len(of["auto"]),
            "always_prefill_tokens_per_s": always,
            "auto_prefill_tokens_per_s": auto,
            "auto_vs_always_pct": 100.0 * (auto / always - 1.0) if always else None,
            "pair_ratios": pairs,
            "k0_proposals": {k: sum(p["prefill_k0_proposals"] or 0 for p in v) for k, v in of.items()},
            "proposals": {k: sum(p["prefill_proposals"] or 0 for p in v) for k, v in of.items()},
            "ttft_ms_median": {k: statistics.mean(p["ttft_ms"]["median"] or 0 for p in v) for k, v in of.items()},
        })  # fmt: skip
    return rows


def markdown(report: dict) -> str:
    lines = []
    if report.get("label"):
        lines += [f"**{report['label']}**", ""]
    lines += [
        f"`{report['command']}`",
        "",
        f"{report['num_prompts']} prompts of {report['input_len']} random token ids per phase, "
        f"max_tokens {report['output_len']}, model `{report['model']}` at {report['url']}.",
        "",
    ]
    if report.get("skipped_phases"):
        lines += [f"**{len(report['skipped_phases'])} phases skipped** (time budget): "
                  + ", ".join(f"{p['load']} {p['policy'] or ''}".strip() for p in report["skipped_phases"]), ""]
    if report.get("ab_summary"):
        lines += [
            "| load | always prefill tok/s | auto prefill tok/s | auto vs always | pair ratios | "
            "K=0 / proposals (auto) | K=0 / proposals (always) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in report["ab_summary"]:
            pairs = row["pair_ratios"]
            spread = f"{min(pairs):.3f}..{max(pairs):.3f}" if pairs else "-"
            k0, props = row["k0_proposals"], row["proposals"]
            lines.append(
                f"| {row['load']} | {_fmt(row['always_prefill_tokens_per_s'], 0)} "
                f"| {_fmt(row['auto_prefill_tokens_per_s'], 0)} | {row['auto_vs_always_pct']:+.1f}% | {spread} "
                f"| {k0['auto']:,} / {props['auto']:,} | {k0['always']:,} / {props['always']:,} |"
            )
        lines.append("")
    lines += [
        "| # | load | policy | requests | failed | TTFT ms mean / median / p99 | ITL ms mean / median / p99 "
        "| TPOT ms median | E2E ms median | req/s | output tok/s | goodput req/s | prefill tok/s "
        "| K=0 / proposals | accept. length |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in report["phases"]:
        ttft, itl = p["ttft_ms"], p["itl_ms"]
        proposals = "-" if p["prefill_proposals"] is None else f"{p['prefill_k0_proposals']:,} / {p['prefill_proposals']:,}"
        lines.append(
            f"| {p['index'] + 1} | {p['load']} | {p['policy'] or '-'} | {p['requests']} | {p['failed']} "
            f"| {_fmt(ttft['mean'])} / {_fmt(ttft['median'])} / {_fmt(ttft['p99'])} "
            f"| {_fmt(itl['mean'])} / {_fmt(itl['median'])} / {_fmt(itl['p99'])} "
            f"| {_fmt(p['tpot_ms']['median'])} | {_fmt(p['e2e_ms']['median'])} | {p['request_throughput']:.2f} "
            f"| {_fmt(p['output_tokens_per_s'])} | {_fmt(p.get('goodput'), 2)} | {_fmt(p['prefill_tokens_per_s'], 0)} "
            f"| {proposals} | {_fmt(p['decode_acceptance_length'], 2)} |"
        )
    return "\n".join(lines) + "\n"


def _load_x(phase: dict) -> float:
    return phase["request_rate"] if phase["request_rate"] else phase["concurrency"]


def _latency_curves(ax_ttft, ax_itl, phases: list[dict], name: str, style: str = "-") -> None:
    by_x: dict[float, list[dict]] = {}
    for p in phases:
        by_x.setdefault(_load_x(p), []).append(p)
    xs = sorted(by_x)
    for ax, key in ((ax_ttft, "ttft_ms"), (ax_itl, "itl_ms")):
        for stat, marker in (("median", "o"), ("p99", "^")):
            ys = [statistics.mean(p[key][stat] or 0 for p in by_x[x]) for x in xs]
            ax.plot(xs, ys, style, marker=marker, label=f"{name} {stat}".strip())


def plot_latency(reports: list[dict], path: Path) -> None:
    """TTFT and ITL (median, p99) against the load level, one curve per run and policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ttft, ax_itl) = plt.subplots(1, 2, figsize=(11, 4))
    for i, report in enumerate(reports):
        style = ("-", "--", ":", "-.")[i % 4]
        policies = list(dict.fromkeys(p["policy"] for p in report["phases"]))
        for policy in policies:
            name = " ".join(part for part in (report.get("label"), policy) if part)
            _latency_curves(ax_ttft, ax_itl, [p for p in report["phases"] if p["policy"] == policy], name, style)
    rate = any(p["request_rate"] for r in reports for p in r["phases"])
    levels = sorted({_load_x(p) for r in reports for p in r["phases"]})
    for ax, title in ((ax_ttft, "time to first token"), (ax_itl, "inter-token latency (per chunk)")):
        ax.set_xscale("log", base=2)  # load levels usually double: 1, 4, 16, 32
        ax.set_xticks(levels, [f"{x:g}" for x in levels])
        ax.minorticks_off()
        ax.set_xlabel("request rate, req/s" if rate else "concurrency")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ab(report: dict, path: Path) -> None:
    """Prefill tokens/s of every phase, in run order, coloured by policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = report["phases"]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(phases) + 2), 4))
    colors = {"auto": "tab:blue", "always": "tab:gray", None: "tab:green"}
    for p in phases:
        ax.bar(p["index"] + 1, p["prefill_tokens_per_s"] or 0, color=colors[p["policy"]])
    from matplotlib.patches import Patch

    handles = [Patch(color=color, label=policy or "single policy")
               for policy, color in colors.items() if any(p["policy"] == policy for p in phases)]  # fmt: skip
    ax.set_xticks([p["index"] + 1 for p in phases])
    top = max([p["prefill_tokens_per_s"] or 0 for p in phases] + [1.0])
    ax.set_ylim(0, top * 1.2)  # the legend above the bars, not over one
    ax.set_xlabel("phase (run order)")
    ax.set_ylabel("prefill worker prompt tokens/s")
    title = " / ".join(f"{r['load']}: auto {r['auto_vs_always_pct']:+.1f}%" for r in report.get("ab_summary", []))
    ax.set_title((report.get("label") + ": " if report.get("label") else "") + (title or "prefill throughput"),
                 fontsize=9)  # fmt: skip
    if handles:  # none when the deadline left no phase to run
        ax.legend(handles=handles, loc="upper center", ncol=len(handles))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(report: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "serve_bench.json", out / "serve_bench.md"]
    written[0].write_text(json.dumps(report, indent=1))
    written[1].write_text(markdown(report))
    try:
        plot_latency([report], out / "serve_bench_latency.png")
        written.append(out / "serve_bench_latency.png")
        if report.get("ab"):
            plot_ab(report, out / "serve_bench_ab.png")
            written.append(out / "serve_bench_ab.png")
    except ImportError:
        pass  # matplotlib is the `bench` extra: no plots without it
    return written
