"""serve_bench's outputs: the A/B summary, a markdown table, PNG plots, the JSON file."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
RATE_SOURCE_TEXT = {
    "prefill_tokens_per_s_saturated": "saturated window",
    "prefill_tokens_per_s": "whole phase",
    "mixed": "mixed",
}


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def pct_text(value, digits: int = 1) -> str:
    """A signed percentage, "-" for None (no figure: e.g. no pair of phases saturated)."""
    return "-" if value is None else f"{value:+.{digits}f}%"


def _ci_text(row: dict) -> str:
    """The auto-vs-always interval, from the row's pair-ratio bootstrap."""
    ci = row.get("auto_vs_always_pct_ci95")
    return "-" if ci is None else f"{pct_text(ci[0])}..{pct_text(ci[1])}"


def _saturation_text(phase: dict) -> str:
    share = phase.get("prefill_saturation_share")
    if share is None:
        return "-"
    return f"{share:.0%}" + (" (unsaturated)" if phase.get("saturated") is False else "")


def _unsaturated_note(report: dict) -> list[str]:
    """A line naming the phases that never saturated the prefill worker (none: no line)."""
    flagged = [p for p in report["phases"] if p.get("saturated") is False]
    if not flagged:
        return []
    floor = report.get("saturation_min")
    threshold = f" (requests waiting in fewer than {floor:.0%} of its queue readings)" if floor is not None else ""
    names = ", ".join(
        f"#{p['index'] + 1} {p['load']} {p['policy'] or ''}".rstrip() + f" {_saturation_text(p)}" for p in flagged
    )
    return [
        f"**{len(flagged)} phases never saturated the prefill worker**{threshold}, "
        f"left out of the A/B figures: {names}",
        "",
    ]


def phase_rate(phase: dict) -> float:
    """The prefill rate a phase is compared by: over its saturated window when its queue was
    sampled (the worker's capacity, not the client's ramp-up and drain), else over the phase."""
    saturated_rate = phase.get("prefill_tokens_per_s_saturated")
    return saturated_rate if saturated_rate is not None else phase["prefill_tokens_per_s"] or 0.0


def rate_source(phases: list[dict]) -> str | None:
    """Which field `phase_rate` took for these phases: one field's name, "mixed", or None (no phase)."""
    sources = {
        "prefill_tokens_per_s_saturated"
        if p.get("prefill_tokens_per_s_saturated") is not None
        else "prefill_tokens_per_s"
        for p in phases
    }
    return sources.pop() if len(sources) == 1 else ("mixed" if sources else None)


def counts_in_ab(phase: dict) -> bool:
    """A phase flagged as never saturating the prefill worker stays out of the A/B figures;
    one without a queue reading (`saturated` None: an older report) is judged by nothing."""
    return phase.get("saturated") is not False


def bootstrap_ci95(ratios: list[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED):
    """95% percentile interval [low, high] of the mean of `ratios`, from `resamples` draws of
    as many ratios with replacement; a fixed seed, so the same ratios give the same interval.
    None with fewer than 2 ratios (one pair has no spread to resample)."""
    if len(ratios) < 2:
        return None
    rng = random.Random(seed)
    means = [statistics.fmean(rng.choices(ratios, k=len(ratios))) for _ in range(resamples)]
    cuts = statistics.quantiles(means, n=40, method="inclusive")  # cut points every 2.5%
    return [cuts[0], cuts[-1]]


def ab_summary(phases: list[dict]) -> list[dict]:
    """Per load level: prefill tokens/s with `always` and `auto`, the difference, each
    interleaved pair's ratio, a bootstrap 95% interval of the mean ratio, and K=0
    proposals / proposals.

    auto and always phases pair in run order (the plan interleaves them ABBA). The rates,
    their difference and the ratios come only from pairs whose two phases saturated the
    prefill worker (`counts_in_ab`): a phase that did not measured the client's pace, not
    the worker. Proposal counts and TTFT cover every phase: they say what each policy did."""
    rows = []
    for load in dict.fromkeys(p["load"] for p in phases):
        of = {
            policy: [p for p in phases if p["load"] == load and p["policy"] == policy] for policy in ("auto", "always")
        }
        if not of["auto"] or not of["always"]:
            continue
        pairs = list(zip(of["auto"], of["always"]))
        used = [(a, b) for a, b in pairs if counts_in_ab(a) and counts_in_ab(b)]
        rate = {"auto": [phase_rate(a) for a, _ in used], "always": [phase_rate(b) for _, b in used]}
        auto = statistics.mean(rate["auto"]) if used else None
        always = statistics.mean(rate["always"]) if used else None
        ratios = [a / b for a, b in zip(rate["auto"], rate["always"]) if b]
        ci = bootstrap_ci95(ratios)
        rows.append(
            {
                "load": load,
                "phases_per_policy": len(of["auto"]),
                "always_prefill_tokens_per_s": always,
                "auto_prefill_tokens_per_s": auto,
                "auto_vs_always_pct": 100.0 * (auto / always - 1.0) if always else None,
                "pair_ratios": ratios,
                "pair_ratio_mean": statistics.fmean(ratios) if ratios else None,
                "pair_ratio_ci95": ci,
                "auto_vs_always_pct_ci95": None if ci is None else [100.0 * (r - 1.0) for r in ci],
                "rate_source": rate_source([p for pair in used for p in pair]),
                "pairs_used": len(used),
                "excluded_pairs": len(pairs) - len(used),
                "unsaturated_phases": {k: sum(not counts_in_ab(p) for p in v) for k, v in of.items()},
                "k0_proposals": {k: sum(p["prefill_k0_proposals"] or 0 for p in v) for k, v in of.items()},
                "proposals": {k: sum(p["prefill_proposals"] or 0 for p in v) for k, v in of.items()},
                "ttft_ms_median": {k: statistics.mean(p["ttft_ms"]["median"] or 0 for p in v) for k, v in of.items()},
            }
        )
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
    if report.get("arrivals") == "vllm":
        lines += [
            "Arrivals: the instants `vllm bench serve` sends at for each phase's seed and rate (`--arrivals vllm`).",
            "",
        ]
    if report.get("skipped_phases"):
        lines += [
            f"**{len(report['skipped_phases'])} phases skipped** (time budget): "
            + ", ".join(f"{p['load']} {p['policy'] or ''}".strip() for p in report["skipped_phases"]),
            "",
        ]
    lines += _unsaturated_note(report)
    if report.get("ab_summary"):
        lines += [
            "| load | always prefill tok/s | auto prefill tok/s | auto vs always | pair ratios | "
            "K=0 / proposals (auto) | K=0 / proposals (always) | auto vs always, 95% CI | pairs used / excluded "
            "| rate over |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in report["ab_summary"]:
            pairs = row["pair_ratios"]
            spread = f"{min(pairs):.3f}..{max(pairs):.3f}" if pairs else "-"
            k0, props = row["k0_proposals"], row["proposals"]
            lines.append(
                f"| {row['load']} | {_fmt(row['always_prefill_tokens_per_s'], 0)} "
                f"| {_fmt(row['auto_prefill_tokens_per_s'], 0)} | {pct_text(row['auto_vs_always_pct'])} | {spread} "
                f"| {k0['auto']:,} / {props['auto']:,} | {k0['always']:,} / {props['always']:,} "
                f"| {_ci_text(row)} | {row.get('pairs_used', len(pairs))} / {row.get('excluded_pairs', 0)} "
                f"| {RATE_SOURCE_TEXT.get(row.get('rate_source'), '-')} |"
            )
        lines.append("")
    lines += [
        "| # | load | policy | requests | failed | TTFT ms mean / median / p99 | ITL ms mean / median / p99 "
        "| TPOT ms median | E2E ms median | req/s | output tok/s | goodput req/s | prefill tok/s "
        "| K=0 / proposals | accept. length | prefill tok/s, saturated window | prefill queue saturated |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in report["phases"]:
        ttft, itl = p["ttft_ms"], p["itl_ms"]
        proposals = (
            "-" if p["prefill_proposals"] is None else f"{p['prefill_k0_proposals']:,} / {p['prefill_proposals']:,}"
        )
        lines.append(
            f"| {p['index'] + 1} | {p['load']} | {p['policy'] or '-'} | {p['requests']} | {p['failed']} "
            f"| {_fmt(ttft['mean'])} / {_fmt(ttft['median'])} / {_fmt(ttft['p99'])} "
            f"| {_fmt(itl['mean'])} / {_fmt(itl['median'])} / {_fmt(itl['p99'])} "
            f"| {_fmt(p['tpot_ms']['median'])} | {_fmt(p['e2e_ms']['median'])} | {p['request_throughput']:.2f} "
            f"| {_fmt(p['output_tokens_per_s'])} | {_fmt(p.get('goodput'), 2)} | {_fmt(p['prefill_tokens_per_s'], 0)} "
            f"| {proposals} | {_fmt(p['decode_acceptance_length'], 2)} "
            f"| {_fmt(p.get('prefill_tokens_per_s_saturated'), 0)} | {_saturation_text(p)} |"
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
    """Prefill tokens/s of every phase (the rate the A/B figures use), in run order, coloured
    by policy; a phase that never saturated the prefill worker hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = report["phases"]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(phases) + 2), 4))
    colors = {"auto": "tab:blue", "always": "tab:gray", None: "tab:green"}
    for p in phases:
        unsaturated = p.get("saturated") is False
        ax.bar(
            p["index"] + 1,
            phase_rate(p),
            color=colors[p["policy"]],
            hatch="//" if unsaturated else None,
            edgecolor="white" if unsaturated else None,
        )
    from matplotlib.patches import Patch

    handles = [
        Patch(color=color, label=policy or "single policy")
        for policy, color in colors.items()
        if any(p["policy"] == policy for p in phases)
    ]
    if any(p.get("saturated") is False for p in phases):
        handles.append(Patch(facecolor="lightgray", hatch="//", edgecolor="white", label="unsaturated (not in A/B)"))
    ax.set_xticks([p["index"] + 1 for p in phases])
    top = max([phase_rate(p) for p in phases] + [1.0])
    ax.set_ylim(0, top * 1.2)  # the legend above the bars, not over one
    ax.set_xlabel("phase (run order)")
    ax.set_ylabel(
        "prefill prompt tokens/s (saturated window)"
        if any(p.get("prefill_tokens_per_s_saturated") is not None for p in phases)
        else "prefill worker prompt tokens/s"
    )
    title = " / ".join(f"{r['load']}: auto {pct_text(r['auto_vs_always_pct'])}" for r in report.get("ab_summary", []))
    ax.set_title(
        (report.get("label") + ": " if report.get("label") else "") + (title or "prefill throughput"), fontsize=9
    )
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
