"""Cache-aware routing's own cost per request, in one process (no worker, no socket).

    python -m loadtest.micro.routing_cost --out loadtest/results/routing_cost/cpu

Each request is a completions body with a distinct text prompt of about `--tokens` tokens
(windows of the shipped model's training text, the Python standard library), routed by a
real `KvRouter` (proxy/routing/kv_router.py) with `routing.tokenizer` set to the shipped
model and its check passed, kv_aware on both pools and conditional disaggregation, in
front of `--prefill` and `--decode` stand-in workers that are never called. Its index
holds `--index-blocks` blocks of other prompts per worker, and each prompt's first half
on one prefill and one decode worker (a hit: the lookups walk that run). Timed over
`--iterations` requests: wall time p50 and p99, CPU time p50 (the process's, every thread:
what the step costs on a machine that is not shared) in milliseconds:

- `encode_inline`: the library's `Tokenizer.encode` (with character offsets) on the
  calling thread, for comparison;
- `tokenize`: `LocalTokenizer.prompt_ids`, as the route plan awaits it (text past
  INLINE_MAX_CHARS on the tokenizer's threads), and the event loop thread's own CPU time
  for it (what other requests wait for);
- `block_keys`: the prompt's chained block keys (`--block-size`);
- `lookup`: `KvIndex.matched_blocks` over both pools' workers, with and without the
  routing notes, as a plan asks it;
- `plan_from_ids`: `KvRouter.plan_for(ids)`: keys, lookups, rendezvous keys, the decode
  worker's pick, the P/D decision;
- `plan`: `KvRouter.plan(body)`: all of the above from the body, as a request's route
  step runs it, and the loop thread's CPU time for it;
- `route`: `plan` plus the prefill worker's pick and both legs' routing notes: the work
  Server-Timing's `route` covers, less the request's other steps.

`--profile` writes the cProfile of the `plan` loop (the top functions by cumulative time)
to profile.txt. Writes routing_cost.json to `--out` and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pdspec.models.build import SHIPPED
from pdspec.models.corpus import iter_corpus_text
from pdspec.settings import RoutingSettings
from proxy.fleet.pool import WorkerPool
from proxy.metrics import ProxyMetrics
from proxy.routing import registry as policies
from proxy.routing.kv_events import Stored
from proxy.routing.kv_index import block_keys
from proxy.routing.kv_router import KvRouter
from proxy.routing.local_tokenizer import LocalTokenizer
from proxy.upstream.client import UpstreamClient

MODEL = SHIPPED / "target"


class Completions:
    """What the route plan reads of the completions API (proxy/apis/api.py's Api)."""

    chat = False
    render_path = None
    render_body = None


def prompts(tokenizer: LocalTokenizer, count: int, tokens: int, seed: int) -> list[str]:
    """`count` distinct texts of about `tokens` tokens: windows of the corpus, cut at token boundaries."""
    text = "".join(iter_corpus_text(4_000_000))
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        start = rng.randrange(0, len(text) - tokens * 8)
        window = text[start : start + tokens * 8]
        offsets = tokenizer.tokenizer.encode(window, add_special_tokens=False).offsets
        if len(offsets) > tokens:
            out.append(window[: offsets[tokens - 1][1]])
    return out


def router(settings: RoutingSettings, prefill: int, decode: int, block_size: int) -> KvRouter:
    info = {"block_size": str(block_size)}
    pools = []
    for name, count in (("prefill", prefill), ("decode", decode)):
        pool = WorkerPool.from_urls(
            name, [f"http://{name}-{i}:1" for i in range(count)], policies.for_pool(settings, name)
        )
        for worker in pool.workers:
            worker.info = dict(info)
        pools.append(pool)
    kv = KvRouter(settings, UpstreamClient(), pools[0], pools[1], ProxyMetrics.create())
    kv.tokenizer_check.agreement.text = kv.tokenizer_check.agreement.chat = True  # as after a passed check
    for pool in pools:
        for worker in pool.workers:
            kv.index.set_block_size(worker.url, block_size)
    return kv


def fill_index(kv: KvRouter, block_size: int, blocks: int, held: list[list[int]], seed: int) -> None:
    """`blocks` blocks of random prompts on every worker; each of `held` (prompts' ids) half
    held by the first prefill and the first decode worker."""
    rng = random.Random(seed)
    engine_hash = iter(range(1, 1 << 62))
    workers = [w.url for pool in (kv.prefill_pool, kv.decode_pool) for w in pool.workers]
    per_event = 64
    for url in workers:
        for _ in range(0, blocks, per_event):
            ids = tuple(rng.randrange(50_000) for _ in range(per_event * block_size))
            event = Stored(tuple(next(engine_hash) for _ in range(per_event)), None, ids, block_size)
            kv.index.apply(url, [event])
    for url in (kv.prefill_pool.workers[0].url, kv.decode_pool.workers[0].url):
        for ids in held:
            count = len(ids) // block_size // 2
            event = Stored(
                tuple(next(engine_hash) for _ in range(count)), None, tuple(ids[: count * block_size]), block_size
            )
            kv.index.apply(url, [event])


def percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"p50_ms": round(pick(0.5), 4), "p99_ms": round(pick(0.99), 4)}


def timed(run: Callable[[int], object], iterations: int) -> dict[str, float]:
    """Wall time and CPU time (this process's, every thread) of each call."""
    wall, cpu = [], []
    for i in range(iterations):
        started, started_cpu = time.perf_counter(), time.process_time()
        run(i)
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    return {**percentiles(wall), **prefixed("cpu_", percentiles(cpu))}


async def timed_async(run: Callable[[int], object], iterations: int) -> dict[str, float]:
    """As `timed`, for awaited calls, and the calling (event loop's) thread's own CPU time."""
    wall, cpu, loop_cpu = [], [], []
    for i in range(iterations):
        started, started_cpu, started_loop = time.perf_counter(), time.process_time(), time.thread_time()
        await run(i)
        loop_cpu.append(time.thread_time() - started_loop)
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    return {**percentiles(wall), **prefixed("cpu_", percentiles(cpu)), **prefixed("loop_cpu_", percentiles(loop_cpu))}


def prefixed(prefix: str, values: dict[str, float]) -> dict[str, float]:
    return {prefix + name: value for name, value in values.items()}


async def measure(args: argparse.Namespace) -> dict:
    settings = RoutingSettings(
        prefill_policy="kv_aware", decode_policy="kv_aware", disaggregation="conditional", tokenizer=MODEL
    )
    kv = router(settings, args.prefill, args.decode, args.block_size)
    tokenizer = kv.tokenizer
    texts = prompts(tokenizer, args.prompts, args.tokens, args.seed)
    bodies = [{"model": "m", "prompt": text, "max_tokens": 16} for text in texts]
    ids = [tokenizer.encode(text, True) for text in texts]
    fill_index(kv, args.block_size, args.index_blocks, ids, args.seed)
    keys = [block_keys(i, args.block_size) for i in ids]
    workers = {pool.name: [w.url for w in pool.workers] for pool in (kv.prefill_pool, kv.decode_pool)}
    n, api = args.prompts, Completions()
    for i in range(n):  # warm: the tokenizer's cache and threads, the index's dicts
        await kv.plan(bodies[i], api)
    sample = await kv.plan(bodies[0], api)  # what the plans see (before `route` adds routing notes)

    def lookup(i: int) -> None:
        for urls in workers.values():
            kv.index.matched_blocks(keys[i % n], urls)
            kv.index.matched_blocks(keys[i % n], urls, routed=False)

    async def route(i: int) -> None:
        plan = await kv.plan(bodies[i % n], api)
        worker = kv.prefill_pool.pick(
            affinity_key=plan.key(kv.prefill_pool.policy),
            cached=plan.prefill_cached,
            building=plan.prefill_building,
            prompt_tokens=plan.prompt_tokens,
        )
        kv.routed(kv.prefill_pool, worker, plan)
        kv.routed(kv.decode_pool, plan.decode_worker, plan)

    iterations = args.iterations
    steps = {
        "encode_inline": timed(lambda i: tokenizer.tokenizer.encode(texts[i % n]).ids, iterations),
        "tokenize": await timed_async(lambda i: tokenizer.prompt_ids(bodies[i % n], False), iterations),
        "block_keys": timed(lambda i: block_keys(ids[i % n], args.block_size), iterations),
        "lookup": timed(lookup, iterations),
        "plan_from_ids": timed(lambda i: kv.plan_for(ids[i % n], args.block_size), iterations),
        "plan": await timed_async(lambda i: kv.plan(bodies[i % n], api), iterations),
        "route": await timed_async(route, iterations),
    }
    profile = None
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(iterations):
            await kv.plan(bodies[i % n], api)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        profile = out.getvalue()
    await kv.close()
    kv.client.close()
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.micro.routing_cost", *sys.argv[1:]]),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "loop": type(asyncio.get_running_loop()).__module__,
        "prompt_tokens_median": sorted(len(i) for i in ids)[n // 2],
        "prompt_chars_median": sorted(len(t) for t in texts)[n // 2],
        "block_size": args.block_size,
        "blocks_per_prompt": len(keys[0]),
        "workers": {"prefill": args.prefill, "decode": args.decode},
        "index_blocks_per_worker": args.index_blocks,
        "cached_tokens_sample": {"prefill": sample.prefill_cached, "decode": sample.decode_cached},
        "iterations": iterations,
        "steps": steps,
        "profile": profile,
    }


def table(report: dict) -> str:
    lines = [
        f"routing cost per request: {report['prompt_tokens_median']}-token text prompts "
        f"({report['prompt_chars_median']} characters), block size {report['block_size']}, "
        f"{report['workers']['prefill']}P{report['workers']['decode']}D, "
        f"{report['index_blocks_per_worker']} indexed blocks a worker, {report['iterations']} requests",
        "",
        "| step | wall p50 ms | wall p99 ms | CPU p50 ms | loop thread CPU p50 ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, step in report["steps"].items():
        loop = step.get("loop_cpu_p50_ms")
        lines.append(
            f"| {name} | {step['p50_ms']:.3f} | {step['p99_ms']:.3f} | {step['cpu_p50_ms']:.3f} | "
            f"{'' if loop is None else f'{loop:.3f}'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prefill", type=int, default=2)
    parser.add_argument("--decode", type=int, default=2)
    parser.add_argument("--index-blocks", type=int, default=20_000)
    parser.add_argument("--prompts", type=int, default=64, help="distinct prompts, cycled")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        import uvloop  # the proxy's loop under uvicorn

        report = uvloop.run(measure(args))
    except ImportError:
        report = asyncio.run(measure(args))
    print(table(report))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        profile = report.pop("profile")
        (args.out / "routing_cost.json").write_text(json.dumps(report, indent=2) + "\n")
        if profile is not None:
            (args.out / "profile.txt").write_text(profile)
        print(f"wrote {args.out / 'routing_cost.json'}")


if __name__ == "__main__":
    main()
