"""routing_bench's figures and report: a run's latencies and where its TTFT went, the
rounds pooled per (workload, policy), the markdown tables and the plot. Pure functions of
the requests' results and the rows routing_bench measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def summarize(results, window_s: float) -> dict:
    ok = [r for r in results if r.ok]

    def dist(values):
        ms = np.asarray(values, dtype=float) * 1000
        return {"median": float(np.median(ms)), "p90": float(np.percentile(ms, 90))} if len(ms) else None

    return {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "ttft_ms": dist([r.ttft_s for r in ok]),
        "itl_ms": dist([g for r in ok for g in r.itl_s]),
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / window_s if window_s else 0.0,
        "ttft_breakdown": ttft_breakdown(ok),
        "prefill_share": prefill_share(ok),
    }


def ttft_breakdown(results) -> dict | None:
    """Where the requests' TTFT went, by the proxy's Server-Timing (ms): each phase's median
    and its mean over the slowest tenth of requests by TTFT (the tail). `first_token` is
    what TTFT has beyond the phases: the KV pull, the decode worker's first step, the
    relay. None without Server-Timing (vLLM's router)."""
    timed = [r for r in results if r.phases_ms]
    if not timed:
        return None
    rows = [{**r.phases_ms, "first_token": max(r.ttft_s * 1000 - sum(r.phases_ms.values()), 0.0)} for r in timed]
    ttft = np.asarray([r.ttft_s for r in timed])
    tail = [row for row, t in zip(rows, ttft) if t >= np.percentile(ttft, 90)]
    names = list(dict.fromkeys(name for row in rows for name in row))
    return {
        "median": {n: float(np.median([row.get(n, 0.0) for row in rows])) for n in names},
        "slowest_tenth": {n: float(np.mean([row.get(n, 0.0) for row in tail])) for n in names},
    }


def prefill_share(results) -> float | None:
    """The busiest prefill worker's share of the prefill legs (0.5: even over two), by the
    replies' X-Pdspec-Prefill-Worker (local prefills left out); None without them."""
    workers = [r.served_by["prefill"] for r in results if r.served_by.get("prefill", "local") != "local"]
    return max(workers.count(w) for w in set(workers)) / len(workers) if workers else None


def pool_run(acc: dict, row: dict, results: list) -> None:
    """Adds one round's run to its (workload, policy) totals."""
    acc.setdefault("results", []).extend(results)
    acc["window_s"] = acc.get("window_s", 0.0) + row["window_s"]
    acc["local_prefills"] = acc.get("local_prefills", 0.0) + row["local_prefills"]
    for pool, (hit, asked) in row["hits"].items():
        total = acc.setdefault("hits", {}).setdefault(pool, [0.0, 0.0])
        total[0] += hit
        total[1] += asked
    for name in ("ideal_hit_rate", "affinity_lru_hit_rate"):
        acc.setdefault(name, []).append(row[name])
    acc.setdefault("ttft_p90_by_round", []).append((row["ttft_ms"] or {}).get("p90"))


def pooled_summary(acc: dict) -> dict:
    """A (workload, policy)'s figures over every round: latencies over all its requests,
    hit rates over all its prompt tokens, the workload's rates averaged over its rounds'
    prompts, and each round's TTFT p90 (the spread between rounds)."""
    hits = acc["hits"]
    return {
        **summarize(acc["results"], acc["window_s"]),
        "prefill_hit_rate": hits["prefill"][0] / max(hits["prefill"][1], 1),
        "decode_hit_rate": hits["decode"][0] / max(hits["decode"][1], 1),
        "ideal_hit_rate": float(np.mean(acc["ideal_hit_rate"])),
        "affinity_lru_hit_rate": float(np.mean(acc["affinity_lru_hit_rate"])),
        "local_prefills": acc["local_prefills"],
        "ttft_p90_ms_by_round": acc["ttft_p90_by_round"],
    }


def markdown(report: dict) -> str:
    lines = [
        f"Command: `{report['command']}`",
        "",
        "| workload | policy | failed | prefill hit | decode hit | ideal | balanced affinity (sim.) | TTFT p50 ms | "
        "TTFT p90 ms | TTFT p90 ms by round | ITL p50 ms | out tok/s | local prefills |",
        "|" + " --- |" * 13,
    ]
    for r in report["runs"]:
        ttft, itl = r["ttft_ms"] or {}, r["itl_ms"] or {}
        lines.append(
            f"| {r['workload']} | {r['policy']} | {r['failed']}/{r['requests']} | {r['prefill_hit_rate']:.2f} "
            f"| {r['decode_hit_rate']:.2f} | {r['ideal_hit_rate']:.2f} | {r.get('affinity_lru_hit_rate', float('nan')):.2f} "
            f"| {ttft.get('median', 0):.0f} | "
            f"{ttft.get('p90', 0):.0f} | {by_round(r)} | {itl.get('median', 0):.0f} | "
            f"{r['output_tokens_per_s']:.1f} | "
            f"{r['local_prefills']:.0f} |"
        )
    lines += breakdown_table(report["runs"])
    events = report.get("kv_events")
    if events and "error" in events:
        lines += ["", f"KV events: the check failed ({events['error']})."]
    elif events:
        held = ", ".join(f"{max(p['decode'].values())}/{p['full_blocks']}" for p in events["prompts"])
        lines += [
            "",
            f"KV events (vLLM {events['vllm_version']}, {', '.join(sorted(set(events['wire_form'].values())))}): "
            f"the decode workers report the blocks they pulled over NIXL: "
            f"{'yes' if events['decode_reports_received_blocks'] else 'NO'} (full blocks the decode pool holds of 4 "
            f"fresh prompts, the last one decides: {held}); malformed events: {events['malformed']}.",
        ]
    return "\n".join(lines) + "\n"


def breakdown_table(runs: list[dict]) -> list[str]:
    """Where TTFT went, per run with Server-Timing: each phase's median, then its mean over
    the slowest tenth of requests."""
    timed = [r for r in runs if r.get("ttft_breakdown")]
    if not timed:
        return []
    phases = ("route", "prefill", "decode", "first_token")
    lines = [
        "",
        "Where TTFT went (ms; the proxy's Server-Timing): median, then the mean over the slowest "
        "tenth of requests; `first_token`: TTFT beyond the phases (KV pull, first decode step, relay); "
        "prefill share: the busiest prefill worker's share of prefill legs.",
        "",
        "| workload | policy | " + " | ".join(phases) + " | prefill share |",
        "|" + " --- |" * 7,
    ]
    for r in timed:
        b = r["ttft_breakdown"]
        cells = [f"{b['median'].get(n, 0):.0f} / {b['slowest_tenth'].get(n, 0):.0f}" for n in phases]
        share = "-" if r.get("prefill_share") is None else f"{r['prefill_share']:.2f}"
        lines.append(f"| {r['workload']} | {r['policy']} | " + " | ".join(cells) + f" | {share} |")
    return lines


def by_round(run: dict) -> str:
    values = run.get("ttft_p90_ms_by_round") or []
    return ", ".join("-" if v is None else f"{v:.0f}" for v in values) or "-"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in report["runs"]})
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.4 * len(workloads)), squeeze=False)
    for row, workload in enumerate(workloads):
        runs = [r for r in report["runs"] if r["workload"] == workload]
        names = [r["policy"].replace("_", "\n") for r in runs]
        x = np.arange(len(runs))
        ax = axes[row][0]
        ax.bar(x - 0.2, [r["prefill_hit_rate"] for r in runs], 0.4, label="prefill pool")
        ax.bar(x + 0.2, [r["decode_hit_rate"] for r in runs], 0.4, label="decode pool")
        ax.axhline(runs[0]["ideal_hit_rate"], color="k", ls="--", lw=1, label="ideal")
        ax.set_xticks(x, names, fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title(f"{workload}: prefix-cache hit rate (vLLM's counters)", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
        ax = axes[row][1]
        ax.bar(x - 0.2, [(r["ttft_ms"] or {}).get("median", 0) for r in runs], 0.4, label="median")
        ax.bar(x + 0.2, [(r["ttft_ms"] or {}).get("p90", 0) for r in runs], 0.4, label="p90")
        ax.set_xticks(x, names, fontsize=8)
        ax.set_title(f"{workload}: TTFT (ms)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
