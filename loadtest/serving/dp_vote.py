"""The data-parallel vote, measured: prefill requests one at a time into prefill workers
that run data parallelism (vLLM 0.33, V2 runner), so one rank is always idle.

With pdspec's vote an idle rank's dummy batch votes "skip drafts", and every real step
runs with K=0; with vLLM's own vote the idle rank makes the busy one draft. The
scheduler's counters (`pdspec_proposals`, `pdspec_k0_proposals`) are the decision before
the ranks agree; the runner's (`pdspec_runner_*`) are what ran.

    python -m loadtest.dp_vote --worker vote=http://127.0.0.1:8100 --worker no-vote=http://127.0.0.1:8300
    python -m loadtest.dp_vote --combine OUT/vote OUT/no-vote --out OUT   # arms run apart

Writes dp_vote.json, dp_vote.md and dp_vote.png (steps run and K=0 steps run per worker).

GPU only (loadtest/gpu/dp_vote_2gpu.sh starts the workers); the requests and the report
are tested against a stand-in worker in tests/unit/loadtest/test_dp_vote.py.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import httpx

from loadtest.serving.worker_metrics import K0_PROPOSALS, PROPOSALS, scrape_when_idle

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
    lines = [
        "| worker | requests | proposals (scheduler) | K=0 (scheduler) | steps run (runner) | K=0 run (runner) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        counts = " | ".join(f"{r[counter]:.0f}" for counter in COUNTERS)
        lines.append(f"| {name} | {r['requests']} | {counts} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    bars = (("steps run", RUNNER_PROPOSALS, "tab:gray"), ("K=0 steps run", RUNNER_K0_PROPOSALS, "tab:blue"))
    for k, (label, counter, color) in enumerate(bars):
        xs = [i + (k - 0.5) * 0.35 for i in range(len(names))]
        heights = [results[n][counter] for n in names]
        ax.bar(xs, heights, width=0.35, label=label, color=color)
        for x, h in zip(xs, heights):
            ax.annotate(f"{h:.0f}", (x, h), ha="center", va="bottom")
    ax.set_xticks(range(len(names)), [f"{n}\n{results[n]['requests']} requests" for n in names])
    top = max([results[n][RUNNER_PROPOSALS] for n in names] + [1.0])
    ax.set_ylim(0, top * 1.35)  # room for the numbers and the legend above the bars
    ax.set_ylabel("prefill worker steps (runner)")
    ax.set_title("Data-parallel prefill worker, one rank idle")
    ax.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(results: dict[str, dict], out: Path) -> None:
    table = report(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dp_vote.json").write_text(json.dumps(results, indent=2))
    (out / "dp_vote.md").write_text(table)
    try:
        plot(results, out / "dp_vote.png")
    except ImportError:
        print("(matplotlib not installed: no plot)", file=sys.stderr)
    print(table)


def combine(dirs: list[Path]) -> dict[str, dict]:
    """One result from arms measured in separate runs (each folder's dp_vote.json). A
    folder without one (its arm failed) is named and left out, so the others still show."""
    results: dict[str, dict] = {}
    for d in dirs:
        path = d / "dp_vote.json"
        if not path.is_file():
            print(f"{path}: missing (that arm wrote no result); left out", file=sys.stderr)
            continue
        for name, result in json.loads(path.read_text()).items():
            if name in results:
                raise SystemExit(f"{path}: worker {name!r} is already in another folder")
            results[name] = result
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="append", default=[], help="NAME=URL of a prefill worker")
    parser.add_argument("--combine", type=Path, nargs="+", help="merge these result folders instead of measuring")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=Path("loadtest/results/dp_vote"))
    args = parser.parse_args(argv)
    if args.combine:
        if args.worker:
            parser.error("--combine merges results; it takes no --worker")
        write_results(combine(args.combine), args.out)
        return
    if not args.worker:
        parser.error("give --worker NAME=URL (or --combine)")
    rng = random.Random(0)
    workers = dict(w.split("=", 1) for w in args.worker)
    results = {}
    with httpx.Client() as client:
        for name, url in workers.items():
            # Fresh prompts per worker: no prefix-cache hit shortens one side.
            prompts = [[rng.randrange(1, args.vocab) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]
            results[name] = {"url": url, "requests": args.requests, **run_worker(client, url, prompts)}
            print(name, results[name], flush=True)
    write_results(results, args.out)


if __name__ == "__main__":
    main()
