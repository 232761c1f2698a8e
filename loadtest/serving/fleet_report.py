"""The fleet benchmark's figures: per (workload, policy, QPS level) latencies, SLO
attainment and goodput, hit rates and recomputed prompt tokens, the router's own cost,
the achievable-hit-rate reference, the issue's goals; tables and plots.

    python -m loadtest.fleet_report DIR [--trace WORKLOAD=FILE ...]

reads DIR/fleet_bench.json and DIR/requests-*.jsonl (fleet_bench's) and writes
DIR/fleet_report.json, DIR/README-tables.md, DIR/ttft_p90_vs_qps.png, DIR/goodput.png.

Definitions (a request that failed or was cut counts as missing every SLO, with an
infinite TTFT in the percentiles):
- TTFT: request sent to its first streamed token; TPOT: (end - TTFT) / (output tokens - 1);
- a level *passes* an SLO when its TTFT p90 and TPOT p90 are both within it;
- goodput under an SLO: the requests per second that met both limits one by one (over the
  level's length in the trace) at the highest level whose p90s
  pass it, 0 when none does (after DistServe's "the highest rate the SLO holds at"); `sustained`:
  the same at the highest level below the first level that fails; beside them,
  `slo_rps`, the requests per second that met both limits one by one, per level;
- fleet hit rate: 1 - prompt tokens the workers computed (vLLM's prompt tokens by source,
  `local_compute`, summed over every worker) / prompt tokens sent;
- prefill-pool hit rate: vLLM's prefix-cache hits / queries on the prefill workers
  (colocated: every worker); acceptance length: 1 + accepted / drafts over all workers;
- router cost: the `route` phase of pdspec's Server-Timing (the route plan: token ids,
  index lookup, scoring), none for vLLM's router;
- achievable hit rate: `loadtest.serving.lru_replay.reference` on the same trace, caches
  of the workers' size, the workers that prefill (2 for P/D, every worker colocated).

Failure policy: a job or level with nothing measured reports None for its figures.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

SLOS = {"strict": {"ttft_ms": 2000.0, "tpot_ms": 50.0}, "relaxed": {"ttft_ms": 2000.0, "tpot_ms": 100.0}}
PRIMARY_SLO = "strict"
# Levels with fewer requests say nothing about a rate (a Poisson draw can give one request).
MIN_REQUESTS = 5
SOURCE_COMPUTE = "source:local_compute"
# One colour per policy in every plot.
COLOURS = {
    "round_robin": "tab:orange",
    "least_outstanding": "tab:gray",
    "prefix_affinity": "tab:green",
    "kv_aware": "tab:blue",
    "kv_aware_prefill": "tab:cyan",
    "kv_aware_conditional": "tab:brown",
    "kv_aware_conditional_full80": "tab:olive",
    "kv_aware_conditional_pending": "tab:pink",
    "kv_aware_conditional_pending_p75": "navy",
    "colocated_kv_aware": "tab:red",
    "vllm_router_cache_aware": "tab:purple",
}


def percentile(values: list[float], q: float) -> float | None:
    """numpy's linear percentile, except that a rank falling on or next to a failed request's
    infinite value is infinite (numpy gives NaN between two infinities)."""
    if not values:
        return None
    ordered = np.sort(np.asarray(values, dtype=float))
    if not np.isfinite(ordered[math.ceil((len(ordered) - 1) * q / 100.0)]):
        return math.inf
    return float(np.percentile(ordered, q))


def _ms(value: float | None) -> float | None:
    """Seconds to ms; an infinite value (a failed request's TTFT in a percentile) stays infinite."""
    return None if value is None else value * 1000.0


def level_stats(
    level: dict, rows: list[dict], colocated: bool, prefill_urls: list[str], duration_s: float | None = None
) -> dict:
    """One level's figures from its requests (`rows`) and the workers' counter deltas;
    `duration_s`, the level's length in the trace (its arrivals' window): the rates per
    second are counts over it (None: over the measured span, first send to last reply)."""
    ok = [r for r in rows if r["ok"]]
    ttft = [r["ttft_s"] if r["ok"] else math.inf for r in rows]
    tpot = [r["tpot_s"] for r in ok if r.get("tpot_s") is not None]
    tpot_all = [r["tpot_s"] if r["ok"] and r.get("tpot_s") is not None else math.inf for r in rows]
    done = [r["done_s"] for r in ok if r.get("done_s") is not None]
    sent = [r["sent_s"] for r in rows if r.get("sent_s") is not None]
    span = duration_s or ((max(done) - min(sent)) if done and sent else None)
    workers = level["workers"]
    computed = sum(w.get(SOURCE_COMPUTE, 0.0) for w in workers.values())
    prompt_sent = sum(r["prompt_tokens"] for r in rows)
    pool = list(workers) if colocated else [u for u in workers if u in prefill_urls]
    hits = sum(workers[u].get("vllm:prefix_cache_hits_total", 0.0) for u in pool)
    queries = sum(workers[u].get("vllm:prefix_cache_queries_total", 0.0) for u in pool)
    drafts = sum(w.get("vllm:spec_decode_num_drafts_total", 0.0) for w in workers.values())
    accepted = sum(w.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) for w in workers.values())
    routes = [r["phases_ms"]["route"] for r in ok if "route" in (r.get("phases_ms") or {})]
    prefill_legs = [r["phases_ms"]["prefill"] for r in ok if "prefill" in (r.get("phases_ms") or {})]
    out = {
        "phase": level["phase"],
        "qps": level["qps"],
        "requests": len(rows),
        "ok": len(ok),
        "failed": len(rows) - len(ok),
        "cut": sum(bool(r.get("cut")) for r in rows),
        "errors": sorted({(r.get("error") or "")[:120] for r in rows if not r["ok"]})[:5],
        "achieved_rps": len(ok) / span if span else None,
        "duration_s": span,
        "ttft_ms": {
            "p50": _ms(percentile(ttft, 50)),
            "p90": _ms(percentile(ttft, 90)),
            "p99": _ms(percentile(ttft, 99)),
        },
        "tpot_ms": {"p50": _ms(percentile(tpot, 50)), "p90": _ms(percentile(tpot_all, 90))},
        "route_ms": {"p50": percentile(routes, 50), "p90": percentile(routes, 90)} if routes else None,
        "prefill_leg_ms": {"p50": percentile(prefill_legs, 50), "p90": percentile(prefill_legs, 90)}
        if prefill_legs
        else None,
        "prompt_tokens": prompt_sent,
        "recomputed_tokens": computed,
        "fleet_hit_rate": 1.0 - computed / prompt_sent if prompt_sent else None,
        "prefill_pool_hit_rate": hits / queries if queries else None,
        "acceptance_length": 1.0 + accepted / drafts if drafts else None,
        "preemptions": sum(w.get("vllm:num_preemptions_total", 0.0) for w in workers.values()),
        "local_prefills": level.get("local_prefills", 0.0),
        "whole_on_prefill": level.get("whole_on_prefill", 0.0),
    }
    for name, slo in SLOS.items():
        met = sum(1 for t, p in zip(ttft, tpot_all) if t * 1000 <= slo["ttft_ms"] and p * 1000 <= slo["tpot_ms"])
        p90_ok = (
            out["ttft_ms"]["p90"] is not None
            and out["ttft_ms"]["p90"] <= slo["ttft_ms"]
            and out["tpot_ms"]["p90"] is not None
            and out["tpot_ms"]["p90"] <= slo["tpot_ms"]
        )
        out.setdefault("slo", {})[name] = {
            "passes": bool(p90_ok),
            "attainment": met / len(rows) if rows else None,
            "slo_rps": met / span if span else None,
        }
    return out


def job_summary(job: dict, rows: list[dict], prefill_urls: list[str], durations: list[float] | None = None) -> dict:
    """A job's levels and goodput; `durations`: each level's length in the trace, in order."""
    colocated = job["policy"] == "colocated_kv_aware"
    by_phase: dict[str, list[dict]] = {}
    for row in rows:
        by_phase.setdefault(row["phase"], []).append(row)
    levels = [
        level_stats(
            level,
            by_phase.get(level["phase"], []),
            colocated,
            prefill_urls,
            durations[i] if durations and i < len(durations) else None,
        )
        for i, level in enumerate(job["levels"])
    ]
    summary = {
        "workload": job["workload"],
        "policy": job["policy"],
        "duration_s": job.get("duration_s"),
        "reset": job.get("reset"),
        "warmup_failed": (job.get("warmup") or {}).get("failed"),
        "levels": levels,
        "goodput": {},
    }
    for name in SLOS:
        passing = [lv for lv in levels if lv["slo"][name]["passes"]]
        best = max(passing, key=lambda lv: lv["qps"]) if passing else None
        # Sustained: the highest level below the first that fails (a noisy pass above a fail not counted).
        held = None
        for lv in sorted(levels, key=lambda lv: lv["qps"]):
            if not lv["slo"][name]["passes"]:
                break
            held = lv
        summary["goodput"][name] = {
            "qps": best["qps"] if best else 0.0,
            "rps": (best["slo"][name]["slo_rps"] or 0.0) if best else 0.0,
            "sustained_qps": held["qps"] if held else 0.0,
            "sustained_rps": (held["slo"][name]["slo_rps"] or 0.0) if held else 0.0,
        }
    measured = [lv for lv in levels if lv["prompt_tokens"]]
    prompt = sum(lv["prompt_tokens"] for lv in measured)
    summary["fleet_hit_rate"] = 1.0 - sum(lv["recomputed_tokens"] for lv in measured) / prompt if prompt else None
    summary["recomputed_tokens"] = sum(lv["recomputed_tokens"] for lv in measured)
    summary["prompt_tokens"] = prompt
    return summary


def reference_for(trace_path: Path, capacity_blocks: int, block_size: int, workers: list[int]) -> dict:
    from loadtest.serving.fleet_trace import read_trace
    from loadtest.serving.lru_replay import reference

    trace = read_trace(trace_path)
    prompts = [trace.prompt(r) for r in trace.requests]
    groups = [r.group for r in trace.requests]
    return reference(prompts, groups, block_size, capacity_blocks, workers, len(trace.phase("warmup")))


def achievable(ref: dict | None, policy: str, prefill_workers: int, all_workers: int) -> float | None:
    """The reference a policy's fleet hit rate is held against: the workers that prefill
    (the prefill pool; every worker where decode workers prefill too), EAGLE's block dropped."""
    if not ref:
        return None
    n = all_workers if policy.startswith(("colocated_kv_aware", "kv_aware_conditional")) else prefill_workers
    return ref["by_workers"][str(n)]["eagle"]["achievable"]


def goals(
    summaries: dict[tuple[str, str], dict],
    ref: dict | None,
    prefill_workers: int,
    all_workers: int,
    workload: str = "shared_context",
) -> list[dict]:
    """The issue's goals on one workload, each with its figures and met / not met / not run."""

    def get(policy):
        return summaries.get((workload, policy))

    def gp(policy):
        s = get(policy)
        return None if s is None else s["goodput"][PRIMARY_SLO]["rps"]

    out = []
    kv, rr, pa, router = gp("kv_aware"), gp("round_robin"), gp("prefix_affinity"), gp("vllm_router_cache_aware")
    for other, value in (("prefix_affinity", pa), ("round_robin", rr)):
        met = None if kv is None or value is None else (kv >= 1.25 * value if value > 0 else kv > 0)
        out.append({"goal": f"kv_aware goodput >= 1.25x {other}'s", "kv_aware": kv, other: value, "met": met})
    out.append(
        {
            "goal": "kv_aware goodput >= vLLM router's",
            "kv_aware": kv,
            "vllm_router": router,
            "met": None if kv is None or router is None else kv >= router,
        }
    )
    knee = None
    if get("round_robin") and get("kv_aware"):
        rr_levels = get("round_robin")["levels"]
        over = [lv for lv in rr_levels if (lv["ttft_ms"]["p90"] or math.inf) > SLOS[PRIMARY_SLO]["ttft_ms"]]
        knee = over[0]["qps"] if over else None
        if knee is not None:
            kv_p90 = next((lv["ttft_ms"]["p90"] for lv in get("kv_aware")["levels"] if lv["qps"] == knee), None)
            rr_p90 = over[0]["ttft_ms"]["p90"]
            ratio = None if kv_p90 is None or rr_p90 is None else kv_p90 / rr_p90
            out.append(
                {
                    "goal": "kv_aware TTFT p90 at the knee <= 0.5x round_robin's",
                    "knee_qps": knee,
                    "kv_aware_ms": kv_p90,
                    "round_robin_ms": rr_p90,
                    "ratio": ratio,
                    "met": None if ratio is None else ratio <= 0.5,
                }
            )
    if knee is None:
        out.append(
            {
                "goal": "kv_aware TTFT p90 at the knee <= 0.5x round_robin's",
                "met": None,
                "note": "round_robin's TTFT p90 stayed inside the SLO at every level (no knee)",
            }
        )
    s = get("kv_aware")
    ach = achievable(ref, "kv_aware", prefill_workers, all_workers)
    if s is not None and ach:
        out.append(
            {
                "goal": "kv_aware fleet hit rate >= 0.9 of the achievable reference",
                "hit": s["fleet_hit_rate"],
                "achievable": ach,
                "ratio": s["fleet_hit_rate"] / ach,
                "met": s["fleet_hit_rate"] >= 0.9 * ach,
            }
        )
    # The conditional rule as pdspec runs it by default (with the pending count, since
    # 2026-12-06) where the run has it; the runs before it have only the plain rule.
    policy = next((p for p in ("kv_aware_conditional_pending", "kv_aware_conditional") if get(p)), None)
    always, colo = get("kv_aware"), get("colocated_kv_aware")
    if policy and always and colo:
        # Under each SLO: the strict one's TPOT limit is decided by noise where eager engines
        # share a GPU (the H100 fleet's TPOT p90 is 55-80 ms at 4 QPS and up for every policy).
        out += [conditional_goal(policy, get(policy), always, colo, slo) for slo in SLOS]
    return out


def conditional_goal(policy: str, cond: dict, always: dict, colo: dict, slo: str) -> dict:
    """The goal "conditional disaggregation never more than 5% under the better of
    always-disaggregated and colocated" under one SLO: per level of the conditional job with at
    least MIN_REQUESTS requests, its SLO-met requests/s against the better of the other two's
    at the same QPS (a level neither ran counts as 0 there), and the worst shortfall."""
    worst = None
    for lv in (lv for lv in cond["levels"] if lv["requests"] >= MIN_REQUESTS):
        best = max(
            ((y["slo"][slo]["slo_rps"] or 0.0) for x in (always, colo) for y in x["levels"] if y["qps"] == lv["qps"]),
            default=0.0,
        )
        mine = lv["slo"][slo]["slo_rps"] or 0.0
        short = (best - mine) / best if best > 0 else 0.0
        if worst is None or short > worst["shortfall"]:
            worst = {"qps": lv["qps"], "conditional": mine, "best_other": best, "shortfall": short}
    return {
        "goal": "conditional never > 5% under the better of always-disaggregated and colocated "
        f"({slo} SLO-met requests/s, per level of >= {MIN_REQUESTS} requests)",
        "policy": policy,
        "slo": slo,
        "worst": worst,
        "met": None if worst is None else worst["shortfall"] <= 0.05,
    }


def _fmt(value, digits=0, pct=False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "inf"
    return f"{value * 100:.0f}%" if pct else f"{value:,.{digits}f}"


def _route(route: dict | None) -> str:
    return "-" if not route else f"{route['p50']:.1f} / {route['p90']:.1f}"


def markdown(report: dict) -> str:
    lines = [f"Command: `{report['command']}`", ""]
    slo = SLOS[PRIMARY_SLO]
    lines += [
        f"SLO `strict`: TTFT p90 <= {slo['ttft_ms']:.0f} ms and TPOT p90 <= {slo['tpot_ms']:.0f} ms; "
        f"`relaxed`: TPOT p90 <= {SLOS['relaxed']['tpot_ms']:.0f} ms. Goodput: requests/s that met the SLO one "
        "by one (over the level's length in the trace) at the highest QPS level whose p90s are inside it "
        "(its offered QPS in brackets); sustained: the same at the highest level below the first that fails.",
        "",
    ]
    for workload in dict.fromkeys(s["workload"] for s in report["summaries"]):
        rows = [s for s in report["summaries"] if s["workload"] == workload]
        ref = (report.get("reference") or {}).get(workload)
        lines += [
            f"### {workload}",
            "",
            "| policy | goodput strict | sustained strict | goodput relaxed | sustained relaxed | fleet hit | "
            "achievable (LRU oracle) | recomputed prompt tokens | acceptance |",
            "|" + " --- |" * 9,
        ]
        for s in rows:
            g, r = s["goodput"]["strict"], s["goodput"]["relaxed"]
            ach = achievable(ref, s["policy"], report["prefill_workers"], report["all_workers"])
            acc = [lv["acceptance_length"] for lv in s["levels"] if lv["acceptance_length"]]
            lines.append(
                f"| {s['policy']} | {_fmt(g['rps'], 2)} ({_fmt(g['qps'], 0)}) | {_fmt(g['sustained_rps'], 2)} "
                f"({_fmt(g['sustained_qps'], 0)}) | {_fmt(r['rps'], 2)} ({_fmt(r['qps'], 0)}) | "
                f"{_fmt(r['sustained_rps'], 2)} ({_fmt(r['sustained_qps'], 0)}) | "
                f"{_fmt(s['fleet_hit_rate'], 2)} | {_fmt(ach, 2)} | "
                f"{_fmt(s['recomputed_tokens'])} of {_fmt(s['prompt_tokens'])} | "
                f"{_fmt(float(np.mean(acc)) if acc else None, 2)} |"
            )
        lines += [
            "",
            "| policy | QPS | ok/sent | achieved rps | TTFT p50 ms | TTFT p90 ms | TPOT p90 ms | "
            "strict | SLO-met rps | fleet hit | prefill-pool hit | route p50/p90 ms | local prefills | "
            "whole on a prefill worker | preemptions |",
            "|" + " --- |" * 15,
        ]
        for s in rows:
            for lv in s["levels"]:
                route = lv["route_ms"]
                lines.append(
                    f"| {s['policy']} | {lv['qps']:g} | {lv['ok']}/{lv['requests']} | {_fmt(lv['achieved_rps'], 2)} | "
                    f"{_fmt(lv['ttft_ms']['p50'])} | {_fmt(lv['ttft_ms']['p90'])} | {_fmt(lv['tpot_ms']['p90'], 1)} | "
                    f"{'pass' if lv['slo']['strict']['passes'] else 'fail'} | {_fmt(lv['slo']['strict']['slo_rps'], 2)} | "
                    f"{_fmt(lv['fleet_hit_rate'], 2)} | {_fmt(lv['prefill_pool_hit_rate'], 2)} | "
                    f"{_route(route)} | "
                    f"{_fmt(lv['local_prefills'])} | {_fmt(lv['whole_on_prefill'])} | {_fmt(lv['preemptions'])} |"
                )
        if ref:
            lines += [
                "",
                "Achievable-hit-rate reference (offline LRU replay of this trace after its warm-up, "
                f"caches of {ref['capacity_blocks']} blocks of {ref['block_size']} tokens; plain / with "
                "EAGLE's dropped last block):",
                "",
                "| workers | oracle | pinned by group | round robin |",
                "| --- | --- | --- | --- |",
            ]
            for n, row in ref["by_workers"].items():
                cells = [f"{row['plain'][k]:.3f} / {row['eagle'][k]:.3f}" for k in ("oracle", "pinned", "round_robin")]
                lines.append(f"| {n} | " + " | ".join(cells) + " |")
            lines.append(f"| unbounded | {ref['unbounded']['plain']:.3f} / {ref['unbounded']['eagle']:.3f} | | |")
        lines.append("")
    if report.get("goals"):
        lines += ["### Goals", ""]
        for workload, items in report["goals"].items():
            for item in items:
                verdict = {True: "**met**", False: "**not met**", None: "not measured"}[item["met"]]
                figures = {k: v for k, v in item.items() if k not in ("goal", "met")}
                lines.append(f"- {workload}: {item['goal']}: {verdict} ({json.dumps(figures, default=str)})")
        lines.append("")
    if report.get("skipped"):
        lines += [
            "Skipped: " + "; ".join(f"{s['workload']}:{s['policy']} ({s['reason']})" for s in report["skipped"]),
            "",
        ]
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(s["workload"] for s in report["summaries"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(6.5 * len(workloads), 4.2), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for s in (s for s in report["summaries"] if s["workload"] == workload):
            qps = [lv["qps"] for lv in s["levels"]]
            p90 = [lv["ttft_ms"]["p90"] for lv in s["levels"]]
            # A p90 that failed requests made infinite is drawn at the plot's ceiling (60 s).
            ax.plot(
                qps,
                [min(v / 1000, 60.0) if v is not None else 60.0 for v in p90],
                marker="o",
                label=s["policy"],
                color=COLOURS.get(s["policy"]),
            )
        ax.axhline(SLOS[PRIMARY_SLO]["ttft_ms"] / 1000, color="k", ls="--", lw=1, label="SLO")
        ax.set_yscale("log")
        ax.set_xlabel("offered QPS")
        ax.set_ylabel("TTFT p90 (s; failed requests count as infinite)")
        ax.set_title(f"{workload}: TTFT p90 against QPS", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "ttft_p90_vs_qps.png", dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(workloads), figsize=(6.5 * len(workloads), 4.2), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        rows = [s for s in report["summaries"] if s["workload"] == workload]
        x = np.arange(len(rows))
        for i, name in enumerate(SLOS):
            bars = ax.bar(x + (i - 0.5) * 0.4, [s["goodput"][name]["rps"] for s in rows], 0.4, label=f"SLO {name}")
            ax.bar_label(bars, fmt="%.2f", fontsize=6)
        ax.set_xticks(x, [s["policy"].replace("_", "\n") for s in rows], fontsize=7)
        ax.set_ylabel("goodput (requests/s)")
        ax.set_title(f"{workload}: goodput", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "goodput.png", dpi=110)
    plt.close(fig)


def read_requests(run_dir: Path, workload: str, policy: str) -> list[dict]:
    """A job's request records: requests-<workload>-<policy>.jsonl, or the same gzipped."""
    import gzip

    path = run_dir / f"requests-{workload}-{policy}.jsonl"
    if path.exists():
        text = path.read_text()
    elif path.with_suffix(".jsonl.gz").exists():
        with gzip.open(path.with_suffix(".jsonl.gz"), "rt") as source:
            text = source.read()
    else:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def build(run_dir: Path, traces: dict[str, Path]) -> dict:
    bench = json.loads((run_dir / "fleet_bench.json").read_text())
    prefill_urls = bench["workers"]["prefill"]
    summaries = []
    for job in bench["jobs"]:
        rows = read_requests(run_dir, job["workload"], job["policy"])
        levels = ((bench.get("traces") or {}).get(job["workload"]) or {}).get("settings", {}).get("levels")
        summaries.append(job_summary(job, rows, prefill_urls, [d for _, d in levels] if levels else None))
    n_prefill, n_all = len(prefill_urls), len(prefill_urls) + len(bench["workers"]["decode"])
    blocks = [b for b in (bench.get("fleet_blocks") or {}).values() if b]
    capacity = int(min(blocks)) - 1 if blocks else bench["kv_blocks"]  # vLLM keeps the null block back
    reference = {
        w: reference_for(p, capacity, bench["block_size"], sorted({n_prefill, n_all})) for w, p in traces.items()
    }
    keyed = {(s["workload"], s["policy"]): s for s in summaries}
    report = {
        "command": bench["command"],
        "fleet_ready_s": bench.get("fleet_ready_s"),
        "total_s": bench.get("total_s"),
        "prefill_workers": n_prefill,
        "all_workers": n_all,
        "capacity_blocks": capacity,
        "slos": SLOS,
        "summaries": summaries,
        "reference": reference,
        "skipped": bench.get("skipped", []),
        "goals": {
            w: goals(keyed, reference.get(w), n_prefill, n_all, w)
            for w in dict.fromkeys(s["workload"] for s in summaries)
        },
    }
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.fleet_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--trace",
        action="append",
        default=[],
        metavar="WORKLOAD=FILE",
        help="the trace a workload ran (for the achievable-hit-rate reference)",
    )
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    traces = {}
    for spec in args.trace:
        workload, sep, path = spec.partition("=")
        if not sep:
            raise SystemExit(f"--trace {spec!r}: expected WORKLOAD=FILE")
        traces[workload] = Path(path)
    report = build(args.run_dir, traces)
    (args.run_dir / "fleet_report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    text = markdown(report)
    (args.run_dir / "README-tables.md").write_text(text)
    if not args.no_plots and report["summaries"]:
        plot(report, args.run_dir)
    print(text)
    return report


if __name__ == "__main__":
    main()
