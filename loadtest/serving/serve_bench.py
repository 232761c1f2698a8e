"""Serving benchmark: a client load through any OpenAI endpoint (pdspec's proxy, or one
vLLM server), with the workers' own counters over each measured phase.

    python -m loadtest.serve_bench --url http://127.0.0.1:8000 --ab \\
        --input-len 8192 --output-len 8 --num-prompts 128 --concurrency 32 --phases 3

Each phase sends `--num-prompts` fresh random prompts (token ids drawn uniformly, or with
`--dataset vllm-random` the texts `vllm bench serve --dataset-name random` sends, or with
`--dataset vllm-prefix-repetition` those of its `prefix_repetition` dataset: `--num-prefixes`
tenants' prefixes of `--prefix-len` tokens, each with suffixes of `--suffix-len`; streamed, `ignore_eos`),
at each load level given (`--concurrency 1 4 16`, or `--request-rate 2 8`). With `--ab`
every phase runs twice, once with the prefill worker's drafts policy `auto` and once
`always`, switched through `pdspec drafts` on the same running stack and interleaved
(auto, always, always, auto, ...), so drift hits both alike.

Phase i (from 0, over the whole run) draws from seed `--seed` + i: with a vllm-* dataset its
prompts are those `vllm bench serve --seed SEED+i` sends for the same dataset flags. With
`--arrivals vllm` and a `--request-rate`, its requests also arrive at the instants that
command sends them at with `--request-rate RATE` (default burstiness, no ramp-up), counted
from the phase's start (its gamma gaps drawn from numpy's state after the same sampling,
scaled so the last leaves at num-prompts / rate; the first waits its own gap; a
`--concurrency` cap then holds them as vLLM's `--max-concurrency` does). Refused (usage
error) where there is no such schedule: the uniform dataset, or concurrency phases (no
`--request-rate`). The warm-up is not a phase: sent at once as always (vLLM's warm-ups
are not on its schedule either).

With only `--url`, the workers are those of a local `pdspec up` (ports and run folder
from pdspec's settings: defaults, PDSPEC_* environment, PDSPEC_CONFIG file).
Writes serve_bench.json, serve_bench.md and PNG plots to `--out`.

While a phase runs, the prefill worker's queue is read every 0.25 s: a phase in which it
had requests waiting in fewer than `--saturation-min` of the readings never saturated it,
and is flagged and left out of the A/B figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from loadtest.serving import queue_sampler, serve_report, worker_metrics
from loadtest.serving.serve_client import (
    completion_body,
    random_prompts,
    run_load,
    vllm_prefix_repetition_prompts,
    vllm_random_prompts,
    vllm_send_offsets,
)
from loadtest.serving.serve_stats import parse_slos, summarize
from pdspec.contract import DRAFTS_POLICIES

POLICIES = DRAFTS_POLICIES
DATASETS = ("uniform", "vllm-random", "vllm-prefix-repetition")
DEFAULT_SATURATION_MIN = 0.89
SATURATION_FIELDS = (
    "prefill_saturation_share",
    "prefill_tokens_per_s_saturated",
    "prefill_queue_samples",
    "prefill_queue_gaps",
    "saturated",
)


@dataclass(frozen=True)
class Load:
    concurrency: int | None
    request_rate: float | None

    @property
    def label(self) -> str:
        if self.request_rate:
            rate = f"rate {self.request_rate:g}/s"
            return rate if self.concurrency is None else f"{rate}, max {self.concurrency}"
        return f"concurrency {self.concurrency}"


def plan_phases(loads: list[Load], phases: int, ab: bool) -> list[tuple[Load, int, str | None]]:
    """(load, repetition, policy) in run order; A/B pairs alternate ABBA so a drift
    over time favours neither policy."""
    plan = []
    for load in loads:
        for rep in range(phases):
            if not ab:
                plan.append((load, rep, None))
                continue
            order = POLICIES if rep % 2 == 0 else POLICIES[::-1]
            plan.extend((load, rep, policy) for policy in order)
    return plan


def loads_from(args: argparse.Namespace) -> list[Load]:
    if args.request_rate:
        cap = args.concurrency[0] if args.concurrency else None
        return [Load(cap, rate) for rate in args.request_rate]
    return [Load(c, None) for c in (args.concurrency or [1])]


def local_stack_defaults() -> dict:
    """Worker URLs, run folder, the target (its tokenizer) and its vocabulary of a local `pdspec up`."""
    from pdspec.settings import UpCommand
    from pdspec.worker.launch import resolve_model_paths

    up = UpCommand()
    target = vocab = None
    try:
        target, _ = resolve_model_paths(up.model)
        vocab = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    except (OSError, KeyError, ValueError):
        pass
    return {
        "prefill_url": f"http://{up.prefill.host}:{up.prefill.port}",
        "decode_url": f"http://{up.decode.host}:{up.decode.port}",
        "run_dir": up.run_dir,
        "vocab_size": vocab,
        "tokenizer": target,
    }


def make_prompts(
    args: argparse.Namespace, count: int, vocab: int, tokenizer, seed: int, model: str, request_rate=None
) -> tuple[list, list[float] | None]:
    """The prompts and their send offsets (None: run_load's own arrivals).

    `--dataset uniform`: token ids drawn uniformly below `vocab`; `vllm-random`: the texts
    `vllm bench serve --dataset-name random --seed SEED` sends (so the two tools can be
    compared on one workload: the content changes how many drafts the decode worker accepts);
    `vllm-prefix-repetition`: those of `--dataset-name prefix_repetition --seed SEED`, in its
    order and aligned to `--url`'s tokenizer as vLLM's tool aligns them (the order decides
    which prefixes are still cached when a tenant comes back). With `--arrivals vllm` and a
    `request_rate`, the offsets are the instants that command sends at with `--request-rate
    RATE` (vllm_send_offsets, drawn right after the sampling, as vLLM's tool draws them)."""
    if args.dataset == "vllm-random":
        prompts = vllm_random_prompts(count, args.input_len, tokenizer, seed)
    elif args.dataset == "vllm-prefix-repetition":
        prompts = vllm_prefix_repetition_prompts(
            count, args.prefix_len, args.suffix_len, args.num_prefixes, tokenizer, seed, server=(args.url, model)
        )
    else:
        return random_prompts(count, args.input_len, vocab, seed=seed), None
    if args.arrivals == "vllm" and request_rate is not None:
        return prompts, vllm_send_offsets(len(prompts), request_rate)
    return prompts, None


def set_drafts_policy(run_dir: Path, policy: str) -> None:
    """Through the command users run: `pdspec drafts` (read by the engine every step)."""
    argv = [
        sys.executable,
        "-m",
        "pdspec.cli",
        "drafts",
        "--role",
        "prefill",
        "--policy",
        policy,
        "--run_dir",
        str(run_dir),
    ]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pdspec drafts failed: {done.stderr.strip() or done.stdout.strip()}")


def first_model(url: str) -> str:
    response = httpx.get(url + "/v1/models", timeout=30)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def measured_load(
    args: argparse.Namespace,
    load: Load,
    bodies: list[dict],
    seed: int,
    prefill_url: str | None,
    on_done,
    offsets: list[float] | None = None,
) -> tuple[list, float, list | None]:
    """One phase's load (run_load's results and window; `offsets`: its send instants), with
    the prefill worker's queue samples taken alongside it; None for the samples when its
    URL is not known."""
    work = run_load(
        args.url,
        bodies,
        load.concurrency,
        load.request_rate,
        seed=seed,
        timeout_s=args.timeout,
        on_done=on_done,
        offsets=offsets,
    )
    if prefill_url is None:
        results, duration = await work
        return results, duration, None
    async with queue_sampler.QueueSampler(prefill_url) as sampler:
        results, duration = await work
    return results, duration, sampler.samples


def saturation_fields(samples: list | None, saturation_min: float) -> dict:
    """The phase's queue fields: all None without samples (no worker metrics); else the
    sampler's summary, and `saturated` when the share of readings with requests waiting
    reached `saturation_min` (no reading at all: not saturated, nothing shows it was)."""
    if samples is None:
        return dict.fromkeys(SATURATION_FIELDS)
    queue = queue_sampler.summarize(samples)
    share = queue["saturation_share"]
    return {
        "prefill_saturation_share": share,
        "prefill_tokens_per_s_saturated": queue["saturated_prefill_tokens_per_s"],
        "prefill_queue_samples": queue["samples"],
        "prefill_queue_gaps": queue["gaps"],
        "saturated": share is not None and share >= saturation_min,
    }


class Progress:
    """One bar over every request of the run (warm-up included)."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True)
        self.failed = 0

    def phase(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text)

    def done(self, result) -> None:
        self.failed += not result.ok
        if self.bar is not None:
            self.bar.update(1)
            if self.failed:
                self.bar.set_postfix(failed=self.failed)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_benchmark(args: argparse.Namespace) -> dict:
    defaults = local_stack_defaults()
    prefill_url = None if args.no_worker_metrics else (args.prefill_url or defaults["prefill_url"])
    decode_url = None if args.no_worker_metrics else (args.decode_url or defaults["decode_url"])
    run_dir = Path(args.run_dir) if args.run_dir else defaults["run_dir"]
    vocab = args.vocab_size or defaults["vocab_size"] or 4096
    tokenizer = args.tokenizer or defaults.get("tokenizer")
    if args.dataset != "uniform" and tokenizer is None:
        raise SystemExit(f"--dataset {args.dataset} needs --tokenizer (no local target model found)")
    model = args.model or first_model(args.url)
    slos = parse_slos(args.goodput or [])
    loads = loads_from(args)
    plan = plan_phases(loads, args.phases, args.ab)
    if args.ab and prefill_url is None:
        raise SystemExit("--ab needs the prefill worker's metrics (drop --no-worker-metrics)")

    progress = Progress(args.warmup + len(plan) * args.num_prompts, not args.no_progress)
    phases, skipped, longest = [], [], 0.0
    with httpx.Client() as metrics_client:

        def idle_counters() -> tuple[dict | None, dict | None]:
            return tuple(
                None if url is None else worker_metrics.scrape_when_idle(metrics_client, url)
                for url in (prefill_url, decode_url)
            )

        try:
            if args.warmup:
                if args.ab:
                    set_drafts_policy(run_dir, "auto")
                progress.phase("warm-up")
                prompts, _ = make_prompts(args, args.warmup, vocab, tokenizer, args.seed - 1, model)
                bodies = [completion_body(model, p, args.output_len) for p in prompts]
                asyncio.run(
                    run_load(
                        args.url, bodies, loads[0].concurrency, None, timeout_s=args.timeout, on_done=progress.done
                    )
                )
            for index, (load, rep, policy) in enumerate(plan):
                if args.deadline and time.time() + longest > args.deadline:
                    # It would not finish in time: skip it, and say so in the report.
                    skipped.append({"index": index, "load": load.label, "policy": policy})
                    continue
                phase_started = time.time()
                if policy is not None:
                    set_drafts_policy(run_dir, policy)
                progress.phase(f"phase {index + 1}/{len(plan)} {load.label}" + (f" {policy}" if policy else ""))
                prompts, offsets = make_prompts(
                    args, args.num_prompts, vocab, tokenizer, args.seed + index, model, load.request_rate
                )
                bodies = [completion_body(model, p, args.output_len) for p in prompts]
                before = idle_counters()
                results, duration, queue = asyncio.run(
                    measured_load(args, load, bodies, args.seed + index, prefill_url, progress.done, offsets)
                )
                after = idle_counters()
                worker_deltas = [None if b is None else worker_metrics.deltas(b, a) for b, a in zip(before, after)]
                phase = {
                    "index": index,
                    "repetition": rep,
                    "policy": policy,
                    "concurrency": load.concurrency,
                    "request_rate": load.request_rate,
                    "load": load.label,
                    # vLLM's instants for the phase's seed and rate, or serve_bench's own draw.
                    "arrivals": None if load.request_rate is None else args.arrivals,
                    **summarize(results, duration, slos),
                    **worker_metrics.worker_figures(*worker_deltas, duration),
                    **saturation_fields(queue, args.saturation_min),
                }
                phases.append(phase)
                longest = max(longest, time.time() - phase_started)
        finally:
            progress.close()
            if args.ab:
                set_drafts_policy(run_dir, "auto")  # leave the stack as pdspec starts it
    return {
        "label": args.label,
        "command": "python -m loadtest.serve_bench " + " ".join(args.argv),
        "url": args.url,
        "model": model,
        "prefill_url": prefill_url,
        "decode_url": decode_url,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_prompts": args.num_prompts,
        "vocab_size": vocab,
        "dataset": args.dataset,
        "arrivals": args.arrivals,
        "prefix_repetition": (
            {"prefix_len": args.prefix_len, "suffix_len": args.suffix_len, "num_prefixes": args.num_prefixes}
            if args.dataset == "vllm-prefix-repetition"
            else None
        ),
        "ab": args.ab,
        "saturation_min": args.saturation_min,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "phases": phases,
        "skipped_phases": skipped,
        "ab_summary": serve_report.ab_summary(phases) if args.ab else [],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.serve_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="OpenAI endpoint: the proxy, or one vLLM server")
    parser.add_argument("--model", help="default: the first model of /v1/models")
    parser.add_argument("--input-len", type=int, default=1024, help="prompt tokens (random ids)")
    parser.add_argument("--output-len", type=int, default=64, help="max_tokens (ignore_eos)")
    parser.add_argument("--num-prompts", type=int, default=64, help="requests per phase")
    parser.add_argument("--concurrency", type=int, nargs="+", help="load levels: requests in flight (default 1)")
    parser.add_argument(
        "--request-rate",
        type=float,
        nargs="+",
        help="load levels: Poisson arrivals per second (--concurrency then caps in-flight)",
    )
    parser.add_argument(
        "--arrivals",
        choices=("own", "vllm"),
        default="own",
        help="with --request-rate: own: serve_bench's Poisson draw; vllm: the instants "
        "`vllm bench serve --seed SEED+phase --request-rate RATE` sends at (a vllm-* dataset only)",
    )
    parser.add_argument("--phases", type=int, default=1, help="phases per load level (and per policy with --ab)")
    parser.add_argument("--ab", action="store_true", help="interleave prefill drafts policy auto / always")
    parser.add_argument("--warmup", type=int, default=0, help="requests sent first and not measured")
    parser.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLOs, e.g. ttft:2000 tpot:50 e2e:5000")
    parser.add_argument("--prefill-url", help="prefill worker (default: local pdspec up's)")
    parser.add_argument("--decode-url", help="decode worker (default: local pdspec up's)")
    parser.add_argument("--run-dir", help="pdspec up's run folder, for --ab (default: pdspec's)")
    parser.add_argument("--no-worker-metrics", action="store_true", help="client-side figures only")
    parser.add_argument(
        "--saturation-min",
        type=float,
        default=DEFAULT_SATURATION_MIN,
        metavar="SHARE",
        help="share of the prefill worker's queue readings (every 0.25 s of a phase) that must have "
        "requests waiting; a phase below it never saturated the prefill worker and is flagged, "
        "not averaged into the A/B figures (default %(default)s)",
    )
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default="uniform",
        help="uniform: token ids drawn uniformly below --vocab-size; vllm-random: the texts of "
        "`vllm bench serve --dataset-name random` for the same seed (needs a tokenizer); "
        "vllm-prefix-repetition: those of its `--dataset-name prefix_repetition` (the three "
        "--prefix-* / --suffix-len / --num-prefixes flags; --input-len is their sum)",
    )
    parser.add_argument("--prefix-len", type=int, help="vllm-prefix-repetition: tokens of each shared prefix")
    parser.add_argument("--suffix-len", type=int, help="vllm-prefix-repetition: tokens after it, per prompt")
    parser.add_argument(
        "--num-prefixes",
        type=int,
        help="vllm-prefix-repetition: the tenants; --num-prompts (and --warmup) must be a multiple",
    )
    parser.add_argument("--tokenizer", help="for the vllm-* datasets (default: the local target model)")
    parser.add_argument("--vocab-size", type=int, help="token ids drawn below this (default: the target's config)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    parser.add_argument(
        "--deadline", type=float, help="Unix time: a phase that would not end by then (longest phase so far) is skipped"
    )
    parser.add_argument("--label", default="", help="a name for this run in tables and plots")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("loadtest/results/serve_bench"))
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv)
    if args.num_prompts < 1 or args.phases < 1 or args.input_len < 1 or args.output_len < 1:
        parser.error("--num-prompts, --phases, --input-len and --output-len must be positive")
    if any(c < 1 for c in args.concurrency or []):
        parser.error("--concurrency must be positive")
    if any(not math.isfinite(r) or r <= 0 for r in args.request_rate or []):
        parser.error("--request-rate must be positive and finite")
    prefix_flags = (args.prefix_len, args.suffix_len, args.num_prefixes)
    if args.dataset == "vllm-prefix-repetition":
        if any(value is None or value < 1 for value in prefix_flags):
            parser.error(
                "--dataset vllm-prefix-repetition needs positive --prefix-len, --suffix-len and --num-prefixes"
            )
        if args.num_prompts % args.num_prefixes or args.warmup % args.num_prefixes:
            # vLLM's sampler gives num_prefixes x (count // num_prefixes) prompts: fewer than asked.
            parser.error("--num-prompts and --warmup must be multiples of --num-prefixes")
        args.input_len = args.prefix_len + args.suffix_len
    elif any(value is not None for value in prefix_flags):
        parser.error("--prefix-len, --suffix-len and --num-prefixes go with --dataset vllm-prefix-repetition")
    if args.arrivals == "vllm" and not args.request_rate:
        parser.error("--arrivals vllm times --request-rate phases: concurrency phases send all at once")
    if args.arrivals == "vllm" and args.dataset == "uniform":
        parser.error("--arrivals vllm needs a vllm-* dataset: its instants follow vLLM's sampling of it")
    if not 0.0 <= args.saturation_min <= 1.0:
        parser.error("--saturation-min is a share: between 0 and 1")
    try:
        parse_slos(args.goodput or [])
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    report = run_benchmark(args)
    written = serve_report.write(report, args.out)
    print(serve_report.markdown(report))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return report


def cli() -> None:
    """The command: exits 1 when any phase had a failed request."""
    report = main()
    sys.exit(1 if any(phase["failed"] for phase in report["phases"]) else 0)


if __name__ == "__main__":
    cli()
