"""Conditional disaggregation's P/D decisions rebuilt from a fleet job's per-request records.

    python -m loadtest.serving.fleet_cond FILE... [--phases level-4,level-5] [--bin-s 1.0]
        [--context 4096] [--kv-tokens 32768] [--lru-tenants 7] [--margin 512] [--load-tokens 256]

FILE: fleet_bench's `requests-<trace>-<policy>.jsonl.gz` of a shared-context trace (sc1x,
sc3x: each request a tenant's `--context`-token private context plus its own query). The
records carry no queue state and no reason for a local prefill, so both are rebuilt:

- **Legs in flight.** A request arrives at `sent_s + route`. A prefill leg runs on its
  prefill worker from arrival for `phases_ms.prefill` (the proxy's lease of the leg); a local
  prefill (`served_by.prefill == "local"`) leases its decode worker from arrival until its
  first token (`Worker.local_prefill_tokens`). A decode leg holds its decode worker's KV from
  its hand-off (arrival + prefill leg; arrival for a local prefill) to `done_s`; it decodes
  from its first token on.
- **What a worker lacks** (`uncached`): a tenant's context hits a worker's prefix cache only
  while the worker holds it. Each worker's cache is modelled as an LRU of `--lru-tenants`
  tenants (32,768 tokens of KV hold 7 requests of 4,352 + 48 tokens), filled in arrival order
  over the whole job (the caches are reset per job, not per level): a prefill leg stores its
  tenant on its prefill worker; every request stores its tenant on its decode worker (pushed
  KV is cached there too). A request lacks its whole prompt on a worker without its tenant,
  else all but the context (less a block: the engine's hit is 4,080 of 4,096 tokens). Checked
  against the engines' `prefix_cache_hits_total` per level (`--bench`).
- **The rule** (proxy/routing/plan.py `local_prefill`, proxy/routing/kv_router.py
  `prefill_work_ahead`) at each arrival, with the decode worker the request went to (before
  the decode leg was picked at hand-off, the plan's decode worker was the one served):
  `prefill_ahead` = load + min over prefill workers of (lacks there + their legs' uncached
  tokens + load per leg), None when a prefill worker has no leg; `decode_ahead` = the decode
  worker's local prefills in flight (their uncached tokens); local when the decode worker
  lacks less than `margin` (cached_on_decode) or when prefill_ahead - (decode_ahead + lacks)
  > margin (prefill_queue). The rebuilt decision is compared with the one taken.

Tables (markdown): per phase the decisions (taken / rebuilt, agreement, why not local);
over time (bins of `--bin-s` from the phase's first arrival) the prefill legs and uncached
tokens in flight per prefill worker, local prefills in flight per decode worker, the decode
legs holding KV and decoding per decode worker, and the rule's margin; and per phase each
worker's prompts prefilled, TTFT and TPOT (for colocated: every worker).
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loadtest.serving.fleet_tail import label, load, pct
from proxy.routing.plan import local_prefill

LOCAL = "local"


@dataclass
class Req:
    id: int
    phase: str
    tenant: int
    prompt: int
    arrive: float  # sent + route (s, the phase's client clock)
    handoff: float  # arrive + prefill leg; arrive for a local prefill
    first: float
    end: float
    pw: str  # prefill worker, or LOCAL
    dw: str
    ttft: float
    tpot: float | None
    pw_uncached: int = 0  # tokens its prefill leg computed (estimate)
    dw_uncached: int = 0  # tokens its decode worker lacked at arrival (estimate)
    extra: dict = field(default_factory=dict)

    @property
    def local(self) -> bool:
        return self.pw == LOCAL


def requests(rows: list[dict]) -> list[Req]:
    """The ok requests with Server-Timing, in arrival order (phases in file order)."""
    out = []
    for r in rows:
        ms = r.get("phases_ms") or {}
        by = r.get("served_by") or {}
        if not r.get("ok") or r.get("ttft_s") is None or "route" not in ms or not by.get("decode"):
            continue
        arrive = r["sent_s"] + ms.get("route", 0.0) / 1e3
        pw = by.get("prefill") or LOCAL
        leg = 0.0 if pw == LOCAL else ms.get("prefill", 0.0) / 1e3
        out.append(
            Req(
                r["id"],
                r["phase"],
                r["group"],
                r["prompt_tokens"],
                arrive,
                arrive + leg,
                r["sent_s"] + r["ttft_s"],
                r["done_s"],
                pw,
                by["decode"],
                r["ttft_s"],
                r.get("tpot_s"),
            )
        )
    order = {p: i for i, p in enumerate(dict.fromkeys(r.phase for r in out))}
    return sorted(out, key=lambda q: (order[q.phase], q.arrive))


class TenantLru:
    """A worker's prefix cache at the grain of tenants: the `size` most recently stored."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.tenants: OrderedDict[int, None] = OrderedDict()

    def holds(self, tenant: int) -> bool:
        return tenant in self.tenants

    def store(self, tenant: int) -> None:
        self.tenants[tenant] = None
        self.tenants.move_to_end(tenant)
        while len(self.tenants) > self.size:
            self.tenants.popitem(last=False)


def estimate_uncached(reqs: list[Req], lru_tenants: int, context: int, block: int = 16) -> dict[str, list[int]]:
    """Fills each request's `pw_uncached` (its prefill leg's, 0 for a local prefill) and
    `dw_uncached` (what its decode worker lacked at its arrival), in arrival order; returns
    each (phase, worker)'s requests as 1 (its tenant was held: a hit saves `context - block`
    tokens) or 0, in order."""
    caches: dict[str, TenantLru] = defaultdict(lambda: TenantLru(lru_tenants))
    hits: dict[str, list[int]] = defaultdict(list)
    saved = context - block
    for q in reqs:  # arrival order: a cache's state when the request was routed
        q.extra["held_by"] = {w for w, c in caches.items() if c.holds(q.tenant)}
        dc = caches[q.dw]
        q.dw_uncached = q.prompt - saved if dc.holds(q.tenant) else q.prompt
        if not q.local:
            pc = caches[q.pw]
            hit = pc.holds(q.tenant)
            q.pw_uncached = q.prompt - saved if hit else q.prompt
            hits[f"{q.phase} {q.pw}"].append(int(hit))
            pc.store(q.tenant)
        hits[f"{q.phase} {q.dw}"].append(int(dc.holds(q.tenant)))
        dc.store(q.tenant)
    return hits


def in_flight(reqs: list[Req], t: float) -> dict[str, dict[str, float]]:
    """The state at `t` per worker: prefill legs and their uncached tokens (`legs`, `pending`),
    local prefills and theirs (`local`, `local_pending`), decode legs holding KV (`held`,
    from hand-off to end) and decoding (`decoding`, first token to end)."""
    s: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for q in reqs:
        if not q.local and q.arrive <= t < q.handoff:
            s[q.pw]["legs"] += 1
            s[q.pw]["pending"] += q.pw_uncached
        if q.local and q.arrive <= t < q.first:
            s[q.dw]["local"] += 1
            s[q.dw]["local_pending"] += q.dw_uncached
        if q.handoff <= t < q.end:
            s[q.dw]["held"] += 1
        if q.first <= t < q.end:
            s[q.dw]["decoding"] += 1
    return s


def rule(
    q: Req,
    state: dict[str, dict[str, float]],
    prefill_workers: list[str],
    margin: int,
    load_tokens: int,
    lacks_on: dict[str, int],
) -> tuple[str | None, float | None, float]:
    """The queue rule at q's arrival on the rebuilt state: (reason or None, prefill_ahead or
    None, decode_ahead). `lacks_on`: the prompt tokens each prefill worker lacks. The
    prefill pool's work ahead is counted as `KvRouter.prefill_work_ahead` counts it (which
    needs a live router, so it is rebuilt here); the decision is the proxy's own
    (`proxy.routing.plan.local_prefill`)."""
    decode_ahead = state[q.dw]["local_pending"]
    ahead = None
    if q.dw_uncached >= margin and prefill_workers and all(state[w]["legs"] > 0 for w in prefill_workers):
        ahead = load_tokens + min(
            lacks_on[w] + state[w]["pending"] + load_tokens * state[w]["legs"] for w in prefill_workers
        )
    return local_prefill(q.prompt, q.prompt - q.dw_uncached, margin, ahead, decode_ahead), ahead, decode_ahead


def decisions(reqs: list[Req], margin: int, load_tokens: int, context: int, block: int = 16) -> None:
    """Fills each request's `extra` with the rebuilt rule's inputs and decision. The request
    itself is left out of the state (it had not arrived); its lacks on each prefill worker
    come from the tenant LRU as of its arrival (`held_by`, from estimate_uncached)."""
    pws = sorted({q.pw for q in reqs if not q.local})
    for q in reqs:
        others = [o for o in reqs if o.phase == q.phase and o is not q]
        state = in_flight(others, q.arrive)
        held = q.extra.get("held_by", set())
        lacks_on = {w: q.prompt - (context - block) if w in held else q.prompt for w in pws}
        reason, ahead, dahead = rule(q, state, pws, margin, load_tokens, lacks_on)
        q.extra.update(
            reason=reason,
            ahead=ahead,
            decode_ahead=dahead,
            idle_prefill=any(state[w]["legs"] == 0 for w in pws),
            state={w: dict(v) for w, v in state.items()},
        )


def phase_table(reqs: list[Req]) -> list[str]:
    rows = [
        "| phase | n | local taken | queue rule rebuilt: local (cached / queue) | agree | not local: a prefill worker idle "
        "| not local: margin not met | rebuilt prefill_ahead - decode side p50 (when weighed) |",
        "|" + " --- |" * 8,
    ]
    for phase in dict.fromkeys(q.phase for q in reqs):
        qs = [q for q in reqs if q.phase == phase]
        taken = sum(q.local for q in qs)
        cached = sum(q.extra["reason"] == "cached_on_decode" for q in qs)
        queue = sum(q.extra["reason"] == "prefill_queue" for q in qs)
        agree = sum((q.extra["reason"] is not None) == q.local for q in qs)
        idle = sum(q.extra["reason"] is None and q.extra["idle_prefill"] for q in qs)
        short = sum(q.extra["reason"] is None and not q.extra["idle_prefill"] for q in qs)
        diff = [q.extra["ahead"] - q.extra["decode_ahead"] - q.dw_uncached for q in qs if q.extra["ahead"] is not None]
        rows.append(
            f"| {phase} | {len(qs)} | {taken} | {cached + queue} ({cached} / {queue}) | {agree}/{len(qs)} "
            f"| {idle} | {short} | {pct(diff, 50):,.0f} |"
        )
    return rows


def time_table(reqs: list[Req], phase: str, bin_s: float) -> list[str]:
    """Mean state per bin: per prefill worker legs (uncached k tokens), per decode worker local
    prefills in flight, decode legs holding KV / decoding; arrivals and local decisions."""
    qs = [q for q in reqs if q.phase == phase]
    if not qs:
        return []
    pws = sorted({q.pw for q in qs if not q.local})
    dws = sorted({q.dw for q in qs})
    t0 = min(q.arrive for q in qs)
    t1 = max(q.end for q in qs)
    cols = [f"P{w[-4:]} legs (k tok)" for w in pws] + [f"D{w[-4:]} local (k tok) / KV legs / decoding" for w in dws]
    head = "| t s | arrivals (local) | " + " | ".join(cols) + " |"
    out = [head, "|" + " --- |" * (2 + len(pws) + len(dws))]
    t = t0
    while t < t1:
        pts = np.linspace(t, t + bin_s, 5, endpoint=False)
        states = [in_flight(qs, p) for p in pts]

        def mean(w: str, k: str, states: list = states) -> float:
            return float(np.mean([s[w][k] for s in states]))

        arr = [q for q in qs if t <= q.arrive < t + bin_s]
        cells = [f"{t - t0:.0f}-{t - t0 + bin_s:.0f}", f"{len(arr)} ({sum(q.local for q in arr)})"]
        cells += [f"{mean(w, 'legs'):.1f} ({mean(w, 'pending') / 1e3:.1f})" for w in pws]
        cells += [
            f"{mean(w, 'local'):.1f} ({mean(w, 'local_pending') / 1e3:.1f}) / {mean(w, 'held'):.1f} / "
            f"{mean(w, 'decoding'):.1f}"
            for w in dws
        ]
        out.append("| " + " | ".join(cells) + " |")
        t += bin_s
    return out


def worker_table(reqs: list[Req], phase: str) -> list[str]:
    """Per worker: prompts it prefilled (legs or local), their uncached k tokens (estimate),
    TTFT p50/p90 and TPOT p50/p90 of the requests it decoded, decoding legs max."""
    qs = [q for q in reqs if q.phase == phase]
    out = [
        "| worker | prompts prefilled (local) | uncached k tok | decoded | TTFT p50/p90 ms of local / disagg "
        "| TPOT p50/p90 ms | decoding max |",
        "|" + " --- |" * 7,
    ]
    for w in sorted({q.dw for q in qs} | {q.pw for q in qs if not q.local}):
        legs = [q for q in qs if q.pw == w]
        loc = [q for q in qs if q.local and q.dw == w]
        dec = [q for q in qs if q.dw == w]
        unc = sum(q.pw_uncached for q in legs) + sum(q.dw_uncached for q in loc)
        dis = [q for q in dec if not q.local]

        def p(v: list[float]) -> str:
            return f"{pct(v, 50) * 1e3:,.0f}/{pct(v, 90) * 1e3:,.0f}" if v else "-"

        tp = [q.tpot for q in dec if q.tpot]
        mx = max((in_flight(dec, q.first)[w]["decoding"] for q in dec), default=0)
        out.append(
            f"| {w.rsplit(':', 1)[-1]} | {len(legs) + len(loc)} ({len(loc)}) | {unc / 1e3:.1f} | {len(dec)} "
            f"| {p([q.ttft for q in loc])} / {p([q.ttft for q in dis])} | {p(tp)} | {mx:.0f} |"
        )
    return out


def hit_check(hits: dict[str, list[int]], bench: Path | None, policy: str, context: int, block: int = 16) -> list[str]:
    """The LRU's hits per (phase, worker) against the engines' prefix-cache hits (in contexts)."""
    if bench is None or not bench.exists():
        return []
    jobs = [j for j in json.loads(bench.read_text())["jobs"] if j["policy"] == policy]
    if not jobs:
        return []
    out = [
        "| phase | worker | hits, tenant LRU | hits, engine (prefix_cache_hits / context) |",
        "| --- | --- | --- | --- |",
    ]
    for lv in jobs[-1]["levels"]:
        for w, m in sorted(lv["workers"].items()):
            h = hits.get(f"{lv['phase']} {w}", [])
            out.append(
                f"| {lv['phase']} | {w.rsplit(':', 1)[-1]} | {sum(h)} of {len(h)} "
                f"| {m['vllm:prefix_cache_hits_total'] / (context - block):.1f} |"
            )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--phases", default="level-4,level-5")
    ap.add_argument("--bin-s", type=float, default=1.0)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--lru-tenants", type=int, default=7)
    ap.add_argument("--margin", type=int, default=512)
    ap.add_argument("--load-tokens", type=int, default=256)
    ap.add_argument("--bench", action="store_true", help="check the LRU against the call's fleet_bench.json")
    args = ap.parse_args(argv)
    phases = args.phases.split(",")
    for path in args.files:
        trace, policy, call = label(path)
        reqs = requests(load(path))
        hits = estimate_uncached(reqs, args.lru_tenants, args.context)
        decisions(reqs, args.margin, args.load_tokens, args.context)
        print(f"## {trace} {policy} ({call})\n")
        print("\n".join(phase_table([q for q in reqs if q.phase in phases])) + "\n")
        for phase in phases:
            print(f"### {phase}: per worker\n")
            print("\n".join(worker_table(reqs, phase)) + "\n")
            print(f"### {phase}: over time\n")
            print("\n".join(time_table(reqs, phase, args.bin_s)) + "\n")
        if args.bench:
            bench = path.parent / "fleet_bench.json"
            print("\n".join(hit_check(hits, bench, policy, args.context)) + "\n")


if __name__ == "__main__":
    main()
