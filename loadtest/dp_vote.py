"""The data-parallel vote, measured: prefill requests one at a time into prefill workers
that run data parallelism (vLLM 0.33, V2 runner), so one rank is always idle.

With pdspec's vote an idle rank's dummy batch votes "skip drafts", and every real step
runs with K=0; with vLLM's own vote the idle rank makes the busy one draft. The
scheduler's counters (`pdspec_proposals`, `pdspec_k0_proposals`) are the decision before
the ranks agree; the runner's (`pdspec_runner_*`) are what ran.

    python -m loadtest.dp_vote --worker vote=http://127.0.0.1:8100 --worker no-vote=http://127.0.0.1:8300

GPU only (loadtest/gpu/dp_vote_2gpu.sh starts the workers); the requests and the report
are tested against a stand-in worker in tests/unit/test_dp_vote.py.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import httpx

from loadtest.worker_metrics import K0_PROPOSALS, PROPOSALS, scrape_when_idle

RUNNER_PROPOSALS = "pdspec_runner_proposals_total"
RUNNER_K0_PROPOSALS = "pdspec_runner_k0_proposals_total"
COUNTERS = (PROPOSALS, K0_PROPOSALS, RUNNER_PROPOSALS, RUNNER_K0_PROPOSALS)


def prefill_body(model: str, prompt_ids: list[int]) -> dict:
    # max_tokens=1, as the proxy's prefill leg: no request can use drafts.
    return {"model": model, "prompt": prompt_ids, "max_tokens": 1, "ignore_eos": True}


def run_worker(client: httpx.Client, url: str, prompts: list[list[int]]) -> dict:
    model = client.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    before = scrape_when_idle(client, url)
    for ids in prompts:  # one in flight at a time: the other rank idles
        client.post(url + "/v1/completions", json=prefill_body(model, ids), timeout=300).raise_for_status()
    after = scrape_when_idle(client, url)
    return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in COUNTERS}


def report(results: dict[str, dict]) -> str:
    lines = ["| worker | requests | proposals (scheduler) | K=0 (scheduler) | steps run (runner) | K=0 run (runner) |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, r in results.items():
        counts = " | ".join(f"{r[counter]:.0f}" for counter in COUNTERS)
        lines.append(f"| {name} | {r['requests']} | {counts} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="append", required=True, help="NAME=URL of a prefill worker")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=Path("loadtest/results/dp_vote"))
    args = parser.parse_args(argv)
    rng = random.Random(0)
    workers = dict(w.split("=", 1) for w in args.worker)
    results = {}
    with httpx.Client() as client:
        for name, url in workers.items():
            # Fresh prompts per worker: no prefix-cache hit shortens one side.
            prompts = [[rng.randrange(1, args.vocab) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]
            results[name] = {"url": url, "requests": args.requests, **run_worker(client, url, prompts)}
            print(name, results[name], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dp_vote.json").write_text(json.dumps(results, indent=2))
    (args.out / "dp_vote.md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
