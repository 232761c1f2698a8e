"""Equality of the KV-only drafter pass: the drafter's KV cache it writes against the
full drafter pass's, on the same prompts, on one in-process engine.

Any drafter the pass covers: EAGLE3 (one layer) and DFlash (the context K/V of every
layer: `--drafter DIR --method dflash --k K`). Every drafter layer's blocks are compared.

Prefill-only requests (`max_tokens=1`, so every step proposes with K=0), chunked at
max_num_batched_tokens. The prompts run twice on the same engine: once with the KV-only
pass off (vLLM's full drafter forward), once with it on. After every drafter call the
drafter layer's cache blocks that the step filled are copied out, keyed by (prompt,
block index in the prompt), so the two runs compare the same positions whatever block
ids the allocator handed out. Prompt lengths are whole blocks, so every block compared
is written in full.

    python -m loadtest.kv_only_equality                 # eager, as pdspec's workers run
    python -m loadtest.kv_only_equality --compiled      # torch.compile, as the benchmarks run
    python -m loadtest.kv_only_equality --drafter DIR --method dflash --k 4   # a DFlash drafter
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
from pathlib import Path
from typing import Any


def capture_drafter_kv(runner: Any, store: dict, counts: dict) -> None:
    """Wrap the runner's drafter so each call copies the drafter KV blocks it completed
    (every drafter layer's, stacked)."""
    import torch

    drafter = runner.drafter
    layers = [layer.self_attn.attn for layer in drafter.model.model.layers] if hasattr(drafter.model, "model") else []
    if not layers:
        raise SystemExit("not an EAGLE- or DFlash-style drafter with model.layers")
    block_size = runner.cache_config.block_size
    original = drafter.propose

    @functools.wraps(original)
    def propose(*args, **kwargs):
        result = original(*args, **kwargs)
        cad = kwargs["common_attn_metadata"]
        seq_lens = cad.seq_lens.cpu().tolist()
        table = cad.block_table_tensor.cpu()
        for i, req_id in enumerate(runner.input_batch.req_ids[: cad.num_reqs]):
            prompt = counts["prompt_of"][tuple(runner.requests[req_id].prompt_token_ids)]
            full_blocks = min(seq_lens[i], counts["prompt_len"][prompt]) // block_size
            for j in range(full_blocks):
                key = (prompt, j)
                if key not in store:
                    store[key] = torch.stack([layer.kv_cache[int(table[i, j])] for layer in layers])
        return result

    drafter.propose = propose
    original_pass = drafter._pdspec_kv_only_pass if hasattr(drafter, "_pdspec_kv_only_pass") else None
    if original_pass is not None:

        def counted(*args, **kwargs):
            counts["kv_only_calls"] += 1
            return original_pass(*args, **kwargs)

        drafter._pdspec_kv_only_pass = counted


def compare(full: dict, kv_only: dict) -> dict:
    import torch

    keys = sorted(full)
    missing = [k for k in keys if k not in kv_only]
    equal = 0
    max_abs = 0.0
    max_rel = 0.0
    max_ulps = 0
    for key in keys:
        if key not in kv_only:
            continue
        a, b = full[key], kv_only[key]
        if torch.equal(a, b):
            equal += 1
            continue
        diff = (a.float() - b.float()).abs()
        max_abs = max(max_abs, diff.max().item())
        max_rel = max(max_rel, (diff / a.float().abs().clamp_min(1e-6)).max().item())
        if a.dtype == torch.float32:  # distance in representable floats
            ia, ib = a.view(torch.int32).long(), b.view(torch.int32).long()
            ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
            ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
            max_ulps = max(max_ulps, (ia - ib).abs().max().item())
    scale = max(full[k].float().abs().max().item() for k in keys) if keys else 0.0
    return {
        "blocks": len(keys),
        "blocks_missing_in_kv_only": len(missing),
        "blocks_bitwise_equal": equal,
        "max_abs_diff": max_abs,
        "max_rel_diff": max_rel,
        "max_ulps_float32": max_ulps,
        "max_abs_value": scale,
    }


def main() -> None:
    from pdspec.settings import ModelSettings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=ModelSettings().models_dir)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--blocks", type=int, nargs="+", default=[40, 75, 128], help="prompt lengths, in blocks")
    parser.add_argument("--mbt", type=int, default=512)
    parser.add_argument("--compiled", action="store_true", help="torch.compile the models (default: eager)")
    parser.add_argument("--drafter", help="drafter folder (default: the shipped EAGLE3 drafter)")
    parser.add_argument("--method", default="eagle3")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model runner in this process
    from vllm import SamplingParams, TokensPrompt

    from loadtest.engine_bench.engines import plugin_engine
    from loadtest.engine_bench.profile_k0 import find_runner

    vocab = json.loads((args.models_dir / "target" / "config.json").read_text())["vocab_size"]
    with plugin_engine(
        models_dir=args.models_dir,
        max_num_batched_tokens=args.mbt,
        max_model_len=4096,
        enforce_eager=not args.compiled,
        drafter=args.drafter,
        method=args.method,
        k=args.k,
    ) as engine:
        runner = find_runner(engine.llm)
        block_size = runner.cache_config.block_size
        rng = random.Random(0)
        lengths = [args.blocks[i % len(args.blocks)] * block_size for i in range(args.prompts)]
        lengths = [min(n, 4096 - 16) // block_size * block_size for n in lengths]
        prompts = [[rng.randrange(10, vocab) for _ in range(n)] for n in lengths]
        counts = {
            "prompt_of": {tuple(p): i for i, p in enumerate(prompts)},
            "prompt_len": lengths,
            "kv_only_calls": 0,
        }
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        runs: dict[str, dict] = {}
        calls: dict[str, int] = {}
        engine.set_policy("auto")
        for mode in ("full", "kv-only"):
            engine.set_kv_only(mode == "kv-only")
            store: dict = {}
            capture_drafter_kv(runner, store, counts)
            before = engine.counters()
            counts["kv_only_calls"] = 0
            engine.llm.generate(inputs, params, use_tqdm=False)
            after = engine.counters()
            runs[mode] = store
            calls[mode] = counts["kv_only_calls"]
            k0 = after["pdspec_k0_proposals_total"] - before["pdspec_k0_proposals_total"]
            steps = after["pdspec_proposals_total"] - before["pdspec_proposals_total"]
            calls[mode + "_k0_steps"] = int(k0)
            calls[mode + "_steps"] = int(steps)
            # Unwrap for the next run (the capture wraps the instance's bound methods).
            del runner.drafter.propose
            if "_pdspec_kv_only_pass" in vars(runner.drafter):
                del runner.drafter._pdspec_kv_only_pass
        dtype = str(next(iter(runs["full"].values())).dtype) if runs["full"] else "?"

    result = compare(runs["full"], runs["kv-only"])
    result.update(
        method=args.method,
        mode="compiled" if args.compiled else "eager",
        dtype=dtype,
        block_size=block_size,
        prompt_tokens=lengths,
        kv_only_calls_in_full_run=calls["full"],
        kv_only_calls_in_kv_only_run=calls["kv-only"],
        steps=calls["kv-only_steps"],
        k0_steps=calls["kv-only_k0_steps"],
    )
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    ok = (
        result["blocks"] > 0
        and result["blocks_missing_in_kv_only"] == 0
        and result["kv_only_calls_in_full_run"] == 0
        and result["kv_only_calls_in_kv_only_run"] > 0
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
