"""`python -m loadtest.engine_profile`: measure an engine profile for the fleet planner
(pdspec/plan/profile.py), with engines built the way pdspec's workers build them.

- **prefill**: a prefill worker's engine (K=0 proposals, KV-only drafter pass, NixlConnector
  `kv_producer`, KV released at once: `prefill_bench --as-prefill-worker`'s engine), one per
  `--prefill-mbt` value; prompts as long as the budget, so every step is full: the step's
  time is the budget over the measured prompt tokens/s. With `--prefill-one-engine`, one
  engine of the largest budget instead, taking one prompt a step (`max_num_seqs` 1), each
  prompt as long as the point's budget: an engine start per point costs more than a GPU
  call can spare (about 40 s each on the H200), and a step's time depends on its tokens,
  not on the budget it was allowed;
- **decode**, for each `--k` (0: no drafter): a decode worker's engine (its launcher's
  options, NixlConnector `kv_consumer`, requests without KV parameters), a batch of B code
  prompts (the local model's own kind of text; random token ids on `--dummy` shapes) each
  decoding `--output-tokens` tokens, for each B of `--batch` (on `--dummy` shapes each prompt is
  `--decode-context` random ids: a step's attention grows with the context): a request's tokens per step
  are 1 + accepted drafts / drafts (vLLM's own spec-decode counters), and a step's time is
  the decode's time (the same batch with max_tokens 1 subtracted: the prefill) over the
  steps a request took;
- **transfer**: not measured here (it needs a P/D pair): `--transfer POINT ...` gives it,
  each `TOKENS:MS` from a hand-off probe (`loadtest.handoff_probe`), and `measured` names it;
- **kv_tokens**: the decode engine's KV blocks times its block size, or `--kv-tokens` with
  `--kv-tokens-source` saying where that figure comes from (engines measured at a part of
  the GPU hold less than a worker given the whole GPU).
- **serving_ms**: not measured here (it needs the whole stack): a profile written here has
  none, and `loadtest.engine_bench.serving_overhead` adds it from a hand-off probe (so a
  re-measured profile needs that step again).

Acceptance on `--dummy` shapes: random drafter weights have every draft rejected, so each
K measures 1.0 tokens a step; the step times are real. `pdspec plan --acceptance-rate`
gives the acceptance of the user's own drafter and prompts (pdspec/plan/profile.py).

Every measured point is the median of `--reps` runs. Writes the profile JSON to `--out` and
prints it. Failure policy: an engine that does not start, or a counter that does not move
where it must (a K > 0 engine that never drafted), stops the run with the reason; no
partial profile is written.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from loadtest.engine_bench.engines import (
    ITL_COUNT,
    ITL_SUM,
    add_engine_arguments,
    decode_worker_engine,
    delta,
    plugin_engine,
    prefill_worker_engine,
)
from loadtest.engine_bench.prefill_bench import engine_features, timed_rep
from pdspec.models.corpus import HELD_OUT_PROMPTS
from pdspec.plan.profile import SCHEMA, EngineProfile


def random_prompts(args: argparse.Namespace, rng: random.Random, count: int, tokens: int) -> list[list[int]]:
    """`count` prompts of `tokens` random ids: fresh ids each call, so no prefix-cache hit."""
    return [[rng.randrange(10, args.vocab) for _ in range(tokens)] for _ in range(count)]


def median_prefill_rate(engine, args: argparse.Namespace, rng: random.Random, tokens: int) -> float:
    """Prompt tokens/s, the median of `--reps` runs of `--prefill-prompts` fresh prompts of `tokens`."""
    return statistics.median(
        timed_rep(engine, random_prompts(args, rng, args.prefill_prompts, tokens), "auto")[0] for _ in range(args.reps)
    )


def prefill_point(args: argparse.Namespace, mbt: int) -> tuple[int, float, dict[str, str]]:
    """(mbt, a full step's ms, the engine's features) for a prefill worker's engine of budget `mbt`."""
    rng = random.Random(mbt)
    prompt_tokens = mbt * max(1, args.prefill_steps_per_prompt)
    engine_args = prefill_worker_engine(args, mbt, prompt_tokens + 16)
    with plugin_engine(**engine_args) as engine:
        features = engine_features(engine)
        timed_rep(engine, random_prompts(args, rng, 2, prompt_tokens), "auto")  # warm-up
        rate = median_prefill_rate(engine, args, rng, prompt_tokens)
    step_ms = 1000 * mbt / rate
    print(f"prefill mbt {mbt}: {rate:,.0f} tok/s, {step_ms:.2f} ms a full step", flush=True)
    return mbt, step_ms, features


def prefill_points_one_engine(args: argparse.Namespace) -> tuple[list[tuple[int, float]], dict[str, str]]:
    """([(tokens, a step's ms)], the engine's features): one prefill worker's engine of the
    largest budget, one prompt a step (`max_num_seqs` 1), each point's prompts as long as
    its budget, so each step holds exactly that many tokens."""
    rng = random.Random(0)
    mbt = max(args.prefill_mbt)
    engine_args = prefill_worker_engine(args, mbt, mbt + 16)
    engine_args["max_num_seqs"] = 1
    points = []
    with plugin_engine(**engine_args) as engine:
        features = engine_features(engine)
        timed_rep(engine, random_prompts(args, rng, 2, mbt), "auto")  # warm-up
        for tokens in sorted(args.prefill_mbt):
            rate = median_prefill_rate(engine, args, rng, tokens)
            points.append((tokens, 1000 * tokens / rate))
            print(f"prefill {tokens} tokens a step: {rate:,.0f} tok/s, {points[-1][1]:.2f} ms", flush=True)
    return points, features


def decode_prompts(args: argparse.Namespace, batch: int, rng: random.Random) -> list:
    from vllm import TokensPrompt

    if args.dummy:
        return [TokensPrompt(prompt_token_ids=ids) for ids in random_prompts(args, rng, batch, args.decode_context)]
    return [HELD_OUT_PROMPTS[i % len(HELD_OUT_PROMPTS)] + f"# {i}\n" for i in range(batch)]


def timed_generate(engine, prompts: list, max_tokens: int) -> tuple[float, dict[str, float]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    before = engine.counters()
    start = time.perf_counter()
    engine.llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, delta(engine.counters(), before)


def decode_curve(args: argparse.Namespace, k: int) -> tuple[list[tuple[int, float]], float, int]:
    """([(batch, step ms)], tokens per step, KV tokens) of a decode engine with draft length `k`."""
    rng = random.Random(k)
    with plugin_engine(**decode_worker_engine(args, k)) as engine:
        config = engine.llm.llm_engine.vllm_config.cache_config
        kv_tokens = int(config.num_gpu_blocks * config.block_size)
        timed_generate(engine, decode_prompts(args, 2, rng), 8)  # warm-up
        points, accepted, drafts = [], 0.0, 0.0
        for batch in args.batch:
            steps_ms = []
            for _ in range(args.reps):
                prompts = decode_prompts(args, batch, rng)
                prefill_s, _ = timed_generate(engine, prompts, 1)
                total_s, counters = timed_generate(engine, prompts, args.output_tokens)
                accepted += counters.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
                drafts += counters.get("vllm:spec_decode_num_drafts_total", 0.0)
                # Each request decodes output_tokens - 1 tokens after its prefill's first one.
                tokens_per_step = 1 + counters.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafts_of(
                    counters
                )
                steps = (args.output_tokens - 1) / tokens_per_step
                if args.decode_step_from == "itl":
                    # vLLM's inter-token latency: one observation per request and step after its
                    # first token, so its mean is the step time the batch's requests saw.
                    count = counters.get(ITL_COUNT, 0.0)
                    if not count:
                        raise SystemExit("--decode-step-from itl: vLLM's inter-token latency histogram did not move")
                    steps_ms.append(1000 * counters.get(ITL_SUM, 0.0) / count)
                else:
                    steps_ms.append(1000 * max(total_s - prefill_s, 0.0) / steps)
            points.append((batch, statistics.median(steps_ms)))
            reps = ", ".join(f"{ms:.2f}" for ms in steps_ms)
            print(f"decode K={k} batch {batch}: {points[-1][1]:.2f} ms a step (reps {reps})", flush=True)
    if k > 0 and drafts == 0:
        raise SystemExit(f"the K={k} engine never drafted: its spec-decode counters did not move")
    tokens_per_step = 1 + accepted / drafts if drafts else 1.0
    print(f"decode K={k}: {tokens_per_step:.2f} tokens a step, KV room {kv_tokens:,} tokens", flush=True)
    return points, tokens_per_step, kv_tokens


def drafts_of(counters: dict[str, float]) -> float:
    """The drafts of a run (1 for a run without a drafter, so its tokens per step stay 1)."""
    return counters.get("vllm:spec_decode_num_drafts_total", 0.0) or 1.0


def transfer_points(given: list[str]) -> list[tuple[int, float]]:
    points = []
    for spec in given:
        tokens, _, ms = spec.partition(":")
        points.append((int(tokens), float(ms)))
    return sorted(points)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.engine_profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_arguments(parser)
    parser.add_argument("--model-shape", required=True, help="what the profile is of, e.g. 'pdspec-tiny'")
    parser.add_argument("--gpu", required=True, help="the accelerator, e.g. 'h200', or 'cpu-2core'")
    parser.add_argument("--drafter-name", help="the drafter as the profile names it (default: '<method> (<path>)')")
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 3, 5], help="draft lengths (0: no drafter)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--prefill-mbt", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument(
        "--prefill-one-engine", action="store_true", help="one prefill engine of the largest budget, a prompt a step"
    )
    parser.add_argument("--prefill-prompts", type=int, default=8)
    parser.add_argument("--prefill-steps-per-prompt", type=int, default=2)
    parser.add_argument(
        "--decode-step-from",
        choices=["subtraction", "itl"],
        default="subtraction",
        help="a decode step's time: the decode's time less a max_tokens 1 run's (prefill) over the steps, "
        "or the mean of vLLM's inter-token latency (no prefill to subtract: steady at large batches)",
    )
    parser.add_argument("--decode-context", type=int, default=32, help="--dummy: each decode prompt's random ids")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-tokens", type=int, help="one engine's KV room, instead of the decode engines' own")
    parser.add_argument("--kv-tokens-source", help="where --kv-tokens comes from (required with it)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--transfer", nargs="+", required=True, metavar="TOKENS:MS", help="measured KV hand-off times")
    parser.add_argument("--transfer-source", required=True, help="where the transfer points were measured")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.kv_tokens is not None and not args.kv_tokens_source:
        parser.error("--kv-tokens needs --kv-tokens-source")
    args.as_prefill_worker = True
    args.k = max(args.ks) or 1
    target = Path(args.target or args.models_dir / "target")
    args.vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    return args


def main(argv: list[str] | None = None) -> EngineProfile:
    args = parse_args(argv)
    import vllm

    started = time.strftime("%Y-%m-%d")
    if args.prefill_one_engine:
        prefill_steps, features = prefill_points_one_engine(args)
    else:
        prefill = [prefill_point(args, mbt) for mbt in sorted(args.prefill_mbt)]
        prefill_steps, features = [(mbt, ms) for mbt, ms, _ in prefill], prefill[-1][2]
    if not str(features.get("kv_only_pass", "")).startswith("on") and args.method == "eagle3":
        print(f"warning: the prefill engines ran without the KV-only pass: {features}", file=sys.stderr)
    decode, kv_tokens = {}, None
    for k in sorted(args.ks):
        points, tokens_per_step, kv = decode_curve(args, k)
        rounded = [(batch, round(ms, 3)) for batch, ms in points]
        decode[k] = {"step_ms": {"points": rounded}, "tokens_per_step": round(tokens_per_step, 3)}
        kv_tokens = kv if kv_tokens is None else min(kv_tokens, kv)
    kv_note = ""
    if args.kv_tokens is not None:
        kv_note = f"; kv_tokens {args.kv_tokens:,} ({args.kv_tokens_source}; the decode engines held {kv_tokens:,})"
        kv_tokens = args.kv_tokens
    command = "python -m loadtest.engine_profile " + " ".join(sys.argv[1:] if argv is None else argv)
    profile = EngineProfile.model_validate(
        {
            "schema": SCHEMA,
            "model_shape": args.model_shape,
            "drafter": args.drafter_name or f"{args.method} ({args.drafter or 'local'})",
            "gpu": args.gpu,
            "vllm_version": vllm.__version__,
            "measured": f"{started}: {command}; prefill engine features {features}; transfer: {args.transfer_source}{kv_note}",
            "prefill": {
                "max_num_batched_tokens": max(args.prefill_mbt),
                "step_ms": {"points": [(tokens, round(ms, 3)) for tokens, ms in prefill_steps]},
            },
            "decode": decode,
            "transfer_ms": {"points": transfer_points(args.transfer)},
            "kv_tokens": kv_tokens,
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(profile.dump())
    print(profile.dump())
    return profile


if __name__ == "__main__":
    main()
