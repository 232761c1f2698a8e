"""Stalls: runs of Poisson arrivals through a stack, each reported by its longest
inter-token gap and its requests whose first token came late.

A stall stops every stream at once: in-flight streams show one long gap, and requests
arriving during it a late first token while the proxy's own phases (Server-Timing: route,
prefill leg, decode leg to its headers; served with `proxy.observability.served_by_headers`)
stay short. `--runs` runs of `--requests` random-token prompts at `--rate` per second, each
with its own prompts; per run it prints (and with `--out`, writes as JSON lines) the
window, the longest gap, the requests whose TTFT exceeded `--slow-ttft-s` with their
Server-Timing, and the proxy's event-loop lag histogram's growth (a proxy that stalled
itself shows there).

`python -m loadtest.serving.stall_probe --url http://127.0.0.1:8000 --runs 12`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtest.serving.serve_client import completion_body, random_prompts, run_load
from loadtest.serving.serve_stats import RequestResult

LAG = "pdspec_proxy_event_loop_lag_seconds_bucket"


def loop_lag_buckets(url: str) -> dict[str, float]:
    """The proxy's event-loop lag histogram, cumulative count by bucket bound."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        sample.labels["le"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == LAG
    }


def run_report(results: list[RequestResult], window_s: float, slow_ttft_s: float) -> dict:
    """One run's figures: its window, longest inter-token gap, the late requests (index,
    TTFT, Server-Timing) and the failed ones."""
    done = [r for r in results if r.ok]
    return {
        "window_s": round(window_s, 2),
        "max_gap_s": round(max((gap for r in done for gap in r.itl_s), default=0.0), 3),
        "slow": [
            {"index": i, "ttft_s": round(r.ttft_s, 3), "phases_ms": r.phases_ms}
            for i, r in enumerate(results)
            if r.ok and r.ttft_s > slow_ttft_s
        ],
        "failed": [r.error for r in results if not r.ok],
    }


async def probe(args: argparse.Namespace) -> list[dict]:
    reports = []
    for run in range(args.runs):
        prompts = random_prompts(args.requests, args.input_len, args.vocab_size, seed=args.seed + run)
        bodies = [completion_body(args.model, prompt, args.max_tokens) for prompt in prompts]
        before, started = loop_lag_buckets(args.url), time.time()
        results, window = await run_load(args.url, bodies, None, args.rate, seed=args.seed + run)
        after = loop_lag_buckets(args.url)
        report = {
            "run": run,
            "started": time.strftime("%H:%M:%S", time.gmtime(started)),
            **run_report(results, window, args.slow_ttft_s),
        }
        report["loop_lag_growth"] = {bound: after[bound] - before.get(bound, 0.0) for bound in after}
        print(json.dumps(report), flush=True)
        reports.append(report)
    return reports


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="pdspec-tiny")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--slow-ttft-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=200)
    parser.add_argument("--out", type=Path, help="also write each run's report here, a JSON line each")
    args = parser.parse_args(argv)
    reports = asyncio.run(probe(args))
    if args.out:
        args.out.write_text("".join(json.dumps(report) + "\n" for report in reports))
    stalled = sum(1 for report in reports if report["max_gap_s"] > 1.0)
    print(f"{stalled} of {len(reports)} runs had a gap over 1 s")
    return reports


if __name__ == "__main__":
    main()
