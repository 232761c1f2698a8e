"""Where a fleet job's TTFT tail comes from, read from its per-request records alone.

    python -m loadtest.serving.fleet_tail FILE... [--phases level-4,level-5] [--window-s 0.1]
    python -m loadtest.serving.fleet_tail FILE --phases level-4 --timeline   # request by request

FILE: fleet_bench's `requests-<trace>-<policy>.jsonl.gz` (one object per request, with the
proxy's Server-Timing `phases_ms` and `served_by`). Each request's times, on its phase's
clock (a level starts once the previous one drained, so phases are read apart):
- `arrive` = sent_s + route: where a route plan (the policies with a KV index: kv_aware,
  kv_aware_prefill, kv_aware_conditional, colocated_kv_aware) picks the decode worker;
- `handoff` = arrive + the prefill leg: the decode leg opens and leases its worker (where
  the other policies pick it), until `done_s`; `first` = sent_s + ttft.
So a decode worker's legs open at t are the requests served by it with handoff <= t < done
(what `least_outstanding` counts); waiting: handoff <= t < first (KV not yet in, or no room).

Per (trace, policy, call, phase), as markdown tables:
1. latency: TTFT, prefill leg, post-prefill (ttft - route - prefill: hand-off, KV push, the
   decode worker's admission and first step), TPOT, decode time (done - first), p50/p90 ms;
   the legs open on a request's decode worker while it decodes, and their correlation with TPOT;
2. the decode pool at each request's hand-off: legs open on its decode worker (all, waiting),
   their correlation with post-prefill time; other hand-offs within `--window-s` to the same
   worker (clump) and to any (pool clump), and the pairs of hand-offs that close, with how
   many share a tenant, a prefill worker, a decode worker; the busiest decode worker's share
   of the phase; the open legs of the busiest worker less the next one's (imbalance); which
   worker the pick favoured: of the requests that found the decode workers' open legs
   unequal (themselves left out), the share that went to the least loaded, by the counts at
   `arrive` and at `handoff`; post-prefill p90 of the requests handed to a busier worker
   than the least loaded, and of the rest;
3. the prefill pool: the busiest prefill worker's share and post-prefill p90 per prefill worker.
The counts come from the client's clock (sent_s is a few ms before the proxy's own start),
so a count can be off by a leg that opened or closed within those ms.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def label(path: Path) -> tuple[str, str, str]:
    """(trace, policy, call) from `[call-x/]requests-<trace>-<policy>.jsonl[.gz]`."""
    stem = path.name.split(".")[0].removeprefix("requests-")
    trace, _, policy = stem.partition("-")
    call = path.parent.name if path.parent.name.startswith("call-") else "r1"
    return trace, policy, call


def timeline(rows: list[dict]) -> list[dict]:
    """Each ok request with its `arrive`, `handoff`, `first`, `end` (s), `post` (s), and its
    decode and prefill workers (`dw`, `pw`; "local": conditional's local prefill). Requests
    without Server-Timing (vLLM's router) are left out: their hand-off is unknown."""
    out = []
    for r in rows:
        ms = r.get("phases_ms") or {}
        if not r.get("ok") or r.get("ttft_s") is None or "prefill" not in ms:
            continue
        route, prefill = ms.get("route", 0.0) / 1000, ms.get("prefill", 0.0) / 1000
        by = r.get("served_by") or {}
        out.append(
            {
                **r,
                "arrive": r["sent_s"] + route,
                "handoff": r["sent_s"] + route + prefill,
                "first": r["sent_s"] + r["ttft_s"],
                "end": r["done_s"],
                "post": r["ttft_s"] - route - prefill,
                "dw": by.get("decode"),
                "pw": by.get("prefill"),
            }
        )
    return out


def open_legs(reqs: list[dict], worker: str, t: float, skip: dict | None = None, waiting: bool = False) -> int:
    """Decode legs open on `worker` at `t` (handoff <= t < end), `skip` left out; with
    `waiting`, only those without their first token yet (handoff <= t < first)."""
    return sum(
        1
        for o in reqs
        if o is not skip and o["dw"] == worker and o["handoff"] <= t < (o["first"] if waiting else o["end"])
    )


def clump(reqs: list[dict], r: dict, window_s: float, same_worker: bool = True) -> int:
    """Other hand-offs within `window_s` of r's (to r's decode worker, or to any)."""
    return sum(
        1
        for o in reqs
        if o is not r and abs(o["handoff"] - r["handoff"]) <= window_s and (not same_worker or o["dw"] == r["dw"])
    )


def close_pairs(reqs: list[dict], window_s: float) -> tuple[int, int, int, int]:
    """Pairs of hand-offs within `window_s`: (all, same tenant, same prefill worker, same decode worker)."""
    pairs = [(a, b) for i, a in enumerate(reqs) for b in reqs[i + 1 :] if abs(a["handoff"] - b["handoff"]) <= window_s]
    return (len(pairs), *(sum(a[k] == b[k] for a, b in pairs) for k in ("group", "pw", "dw")))


def pick_to_least(reqs: list[dict], workers: list[str], at: str) -> tuple[int, int]:
    """(picks that went to a least-loaded decode worker, picks where the loads differed), by the
    decode legs open at each request's `at` ("arrive" or "handoff"), the request itself left out."""
    least = decisive = 0
    for r in reqs:
        load = {w: open_legs(reqs, w, r[at], skip=r) for w in workers}
        if len(set(load.values())) > 1:
            decisive += 1
            least += load[r["dw"]] == min(load.values())
    return least, decisive


def pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def corr(x, y) -> float:
    return float(np.corrcoef(x, y)[0, 1]) if len(x) > 2 and np.std(x) > 0 and np.std(y) > 0 else float("nan")


def phase_stats(rows: list[dict], window_s: float) -> dict:
    reqs = timeline(rows)
    if not reqs:
        return {"n": 0}
    dws = sorted({r["dw"] for r in reqs if r["dw"]})
    pws = sorted({r["pw"] for r in reqs if r["pw"]})
    for r in reqs:
        r["open"] = open_legs(reqs, r["dw"], r["handoff"], skip=r)
        r["waiting"] = open_legs(reqs, r["dw"], r["handoff"], skip=r, waiting=True)
        r["clump"] = clump(reqs, r, window_s)
        r["pool_clump"] = clump(reqs, r, window_s, same_worker=False)
        loads = sorted((open_legs(reqs, w, r["handoff"]) for w in dws), reverse=True)
        r["imbalance"] = loads[0] - loads[1] if len(loads) > 1 else 0
        r["busier"] = r["open"] > min(open_legs(reqs, w, r["handoff"], skip=r) for w in dws)
        # Legs open on its decode worker while it decodes (10 points from first token to end).
        r["during"] = float(np.mean([open_legs(reqs, r["dw"], t) for t in np.linspace(r["first"], r["end"], 10)]))
    post = [r["post"] for r in reqs]
    dshare, pshare = Counter(r["dw"] for r in reqs), Counter(r["pw"] for r in reqs)
    by_pw = defaultdict(list)
    for r in reqs:
        by_pw[r["pw"]].append(r["post"])
    return {
        "n": len(reqs),
        "ttft": [pct([r["ttft_s"] for r in reqs], q) * 1e3 for q in (50, 90)],
        "prefill": [pct([r["phases_ms"]["prefill"] for r in reqs], q) for q in (50, 90)],
        "post": [pct(post, q) * 1e3 for q in (50, 90)],
        "tpot": [pct([r["tpot_s"] for r in reqs if r.get("tpot_s")], q) * 1e3 for q in (50, 90)],
        "decode_s": pct([r["end"] - r["first"] for r in reqs], 50),
        "during": float(np.mean([r["during"] for r in reqs])),
        "corr_tpot": corr([r.get("tpot_s") or 0.0 for r in reqs], [r["during"] for r in reqs]),
        "out": float(np.mean([r.get("output_tokens") or 0 for r in reqs])),
        "open": (float(np.mean([r["open"] for r in reqs])), max(r["open"] for r in reqs)),
        "waiting": float(np.mean([r["waiting"] for r in reqs])),
        "corr_open": corr(post, [r["open"] for r in reqs]),
        "corr_waiting": corr(post, [r["waiting"] for r in reqs]),
        "clump": float(np.mean([r["clump"] for r in reqs])),
        "pool_clump": float(np.mean([r["pool_clump"] for r in reqs])),
        "dshare": max(dshare.values()) / len(reqs),
        "imbalance": float(np.mean([r["imbalance"] for r in reqs])),
        "pairs": close_pairs(reqs, window_s),
        "post_busier": [
            [pct([r["post"] for r in reqs if r["busier"] == b], 90) * 1e3 for b in (True, False)],
            sum(r["busier"] for r in reqs),
        ],
        "least_arrive": pick_to_least(reqs, dws, "arrive"),
        "least_handoff": pick_to_least(reqs, dws, "handoff"),
        "pshare": max(pshare.values()) / len(reqs),
        "post_by_pw": {w.rsplit(":", 1)[-1]: pct(by_pw[w], 90) * 1e3 for w in pws},
    }


def ms(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"  # nan: no such request


def frac(pair: tuple[int, int]) -> str:
    return f"{pair[0]}/{pair[1]}" + (f" ({pair[0] / pair[1]:.0%})" if pair[1] else "")


def tables(results: list[tuple[tuple[str, str, str, str], dict]]) -> str:
    def pair(v, fmt="{:,.0f}"):
        return " / ".join(fmt.format(x) for x in v)

    head = "| trace | policy | call | phase | n |"
    lat = [
        head + " TTFT p50/p90 ms | prefill leg p50/p90 | post-prefill p50/p90 | TPOT p50/p90 | decode s p50 | out tok "
        "| legs open while decoding | corr(TPOT, those) |",
        "|" + " --- |" * 13,
    ]
    dec = [
        head + " open legs at hand-off mean/max | waiting mean | corr(post, open / waiting) "
        "| clump same worker / pool | close pairs: all, same tenant / prefill / decode worker | busiest decode share "
        "| open-leg imbalance | to least loaded at arrival | at hand-off | post p90 to a busier worker (n) / rest |",
        "|" + " --- |" * 15,
    ]
    pre = [head + " busiest prefill share | post-prefill p90 by prefill worker |", "|" + " --- |" * 7]
    none = [" ".join(key) for key, s in results if not s["n"]]
    for key, s in results:
        row = "| " + " | ".join(key) + f" | {s['n']} |"
        if not s["n"]:
            continue
        lat.append(
            row + f" {pair(s['ttft'])} | {pair(s['prefill'])} | {pair(s['post'])} | {pair(s['tpot'])} "
            f"| {s['decode_s']:.2f} | {s['out']:.0f} | {s['during']:.1f} | {s['corr_tpot']:.2f} |"
        )
        dec.append(
            row + f" {s['open'][0]:.1f} / {s['open'][1]} | {s['waiting']:.1f} "
            f"| {s['corr_open']:.2f} / {s['corr_waiting']:.2f} | {s['clump']:.2f} / {s['pool_clump']:.2f} "
            f"| {'{}: {} / {} / {}'.format(*s['pairs'])} | {s['dshare']:.2f} | {s['imbalance']:.2f} "
            f"| {frac(s['least_arrive'])} | {frac(s['least_handoff'])} "
            f"| {ms(s['post_busier'][0][0])} ({s['post_busier'][1]}) / {ms(s['post_busier'][0][1])} |"
        )
        by_pw = ", ".join(f"{w}: {ms(v)}" for w, v in s["post_by_pw"].items())
        pre.append(row + f" {s['pshare']:.2f} | {by_pw} |")
    note = ["", "Left out, no request with Server-Timing (vLLM's router): " + ", ".join(none)] if none else []
    return "\n".join(
        ["### Latency", "", *lat, "", "### Decode pool", "", *dec, "", "### Prefill pool", "", *pre, *note]
    )


def timeline_rows(rows: list[dict]) -> str:
    """One phase, request by request in hand-off order: the decode legs open on each worker at
    its arrival and at its hand-off (waiting ones in brackets), where it went, its post-prefill."""
    reqs = sorted(timeline(rows), key=lambda r: r["handoff"])
    dws = sorted({r["dw"] for r in reqs})

    def loads(t, r):
        return " ".join(f"{open_legs(reqs, w, t, r)}({open_legs(reqs, w, t, r, True)})" for w in dws)

    out = ["| arrive s | hand-off s | open (waiting) at arrival | at hand-off | decode worker | tenant | post ms |"]
    out.append("|" + " --- |" * 7)
    for r in reqs:
        out.append(
            f"| {r['arrive']:.2f} | {r['handoff']:.2f} | {loads(r['arrive'], r)} | {loads(r['handoff'], r)} "
            f"| {r['dw'].rsplit(':', 1)[-1]} | {r['group']} | {r['post'] * 1e3:,.0f} |"
        )
    return "\n".join([f"Decode workers, in order: {', '.join(dws)}", "", *out])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="requests-<trace>-<policy>.jsonl[.gz]")
    ap.add_argument("--phases", default="level-3,level-4,level-5", help="comma-separated phases (default: 6-11 QPS)")
    ap.add_argument("--window-s", type=float, default=0.1, help="clump window around a hand-off (s)")
    ap.add_argument("--timeline", action="store_true", help="each request of the (first) file and phase instead")
    args = ap.parse_args(argv)
    phases = args.phases.split(",")
    if args.timeline:
        print(timeline_rows([r for r in load(args.files[0]) if r["phase"] == phases[0]]))
        return
    results = []
    for path in args.files:
        by_phase = defaultdict(list)
        for r in load(path):
            by_phase[r["phase"]].append(r)
        for phase in phases:
            if phase in by_phase:
                results.append(((*label(path), phase), phase_stats(by_phase[phase], args.window_s)))
    results.sort(key=lambda kv: (kv[0][0], kv[0][3], kv[0][1], kv[0][2]))
    print(tables(results))


if __name__ == "__main__":
    main()
