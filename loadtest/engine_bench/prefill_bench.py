"""Prefill-only benchmark: K=0 (`auto`) against drafting every step (`always`), and
against an engine with no drafter at all (`--baseline`).

One drafter engine per max_num_batched_tokens (and with `--baseline` a plain engine with
no drafter beside it, both alive at once); on them, a warm-up each, then timed reps of
the modes interleaved (their order alternates rep by rep), so drift on a noisy machine
hits all alike. Modes:
- `auto`: pdspec's K=0 proposals (with the KV-only drafter pass, unless it is off);
- `always`: drafting every step;
- `full`: K=0 with the KV-only pass switched off (vLLM's whole drafter forward);
- `none`: the no-drafter engine (`--baseline` adds it).
Reported: prompt tokens/s per rep, ratios of medians (`auto/always`, and with a
baseline one line `k0/no-drafter: R` per size), pair ranges, and the counters.

    python -m loadtest.prefill_bench                          # CPU: 32 x 2048 tokens, mbt 512 and 2048
    python -m loadtest.prefill_bench --baseline --modes auto full  # K=0 with/without KV-only vs no drafter
    python -m loadtest.prefill_bench --target deploy/shapes/qwen3-8b --drafter deploy/shapes/qwen3-8b-eagle3 \\
        --prompts 32 --prompt-tokens 16384 --mbt 512 2048 --dummy --baseline --gpu-memory-utilization 0.4  # GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadtest.engine_bench.engines import (
    add_engine_arguments,
    delta,
    engine_args_from,
    plugin_engine,
    prefill_worker_engine,
)
from loadtest.engine_bench.rep_diagnostics import RepProbe, describe


def engine_features(engine) -> dict[str, str]:
    """The engine's feature states (pdspec_engine_feature), as "on" or "off: reason": a
    benchmark says whether what it measures was on."""
    states = {}
    for family in engine.collect():
        for sample in family.samples:
            if sample.name == "pdspec_engine_feature" and sample.value == 1:
                labels = sample.labels
                states[labels["feature"]] = labels["state"] + (f": {labels['reason']}" if labels["reason"] else "")
    return states


@dataclass
class BenchResult:
    mbt: int
    prompts: int
    prompt_tokens: int
    tokens_per_s: dict[str, list[float]] = field(default_factory=dict)
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    as_prefill_worker: bool = False  # engines built as `pdspec prefill` builds its own (KV connector on)
    features: dict[str, str] = field(default_factory=dict)  # the drafter engine's pdspec_engine_feature states
    # Per mode, per rep: the engine process's CPU, GC and memory, the GPU's clocks (rep_diagnostics).
    diagnostics: dict[str, list[dict]] = field(default_factory=dict)
    # DFlash on V2, test-only verification: graph steps whose KV equalled / differed from the eager path's.
    graph_verified: dict[str, float] = field(default_factory=dict)

    def median(self, mode: str) -> float:
        return statistics.median(self.tokens_per_s[mode])

    def ratio_of(self, mode: str, base: str) -> float | None:
        if not self.tokens_per_s.get(mode) or not self.tokens_per_s.get(base):
            return None
        return self.median(mode) / self.median(base)

    def pairs_of(self, mode: str, base: str) -> list[float]:
        return [a / b for a, b in zip(self.tokens_per_s.get(mode, []), self.tokens_per_s.get(base, []))]

    @property
    def ratio(self) -> float | None:
        return self.ratio_of("auto", "always")

    @property
    def pair_ratios(self) -> list[float]:
        return self.pairs_of("auto", "always")


def timed_rep(engine, prompts, policy: str | None) -> tuple[float, dict]:
    from vllm import SamplingParams, TokensPrompt

    if policy is not None:
        engine.set_policy(policy)
    extra = {"kv_transfer_params": engine.kv_transfer_params} if engine.kv_transfer_params else None
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False, extra_args=extra)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    before = engine.counters()
    start = time.perf_counter()
    engine.llm.generate(inputs, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(map(len, prompts)) / elapsed, delta(engine.counters(), before)


WARM_UP_PROMPTS = 4  # of the warm-up of each mode beyond `auto` and `none`


def rep_orders(modes: list[str], reps: int) -> list[list[str]]:
    """Each rep runs every mode once; odd reps reverse the order, so no mode always
    runs first (or right after the same neighbour)."""
    return [list(modes) if i % 2 == 0 else list(reversed(modes)) for i in range(reps)]


def bench(
    engine_args: dict,
    mbt: int,
    num_prompts: int,
    prompt_tokens: int,
    reps: int,
    vocab: int,
    modes: list[str],
    worker_args: argparse.Namespace | None = None,
) -> BenchResult:
    """`worker_args`: build both engines as a prefill worker builds its own
    (`prefill_worker_engine`), not as a bare engine."""
    rng = random.Random(mbt)
    result = BenchResult(
        mbt, num_prompts, prompt_tokens, tokens_per_s={m: [] for m in modes}, as_prefill_worker=worker_args is not None
    )
    limits = dict(max_num_batched_tokens=mbt, max_model_len=prompt_tokens + 16)
    if worker_args is not None:
        # Two engines in one process: each its own NIXL side channel.
        plain_args = prefill_worker_engine(worker_args, mbt, prompt_tokens + 16, method="none", side_channel_port=5610)
        drafter_args = prefill_worker_engine(worker_args, mbt, prompt_tokens + 16)
    else:
        plain_args = {**limits, **engine_args, "method": "none"}
        drafter_args = {**limits, **engine_args}
    with contextlib.ExitStack() as stack:
        # The plain engine first: the drafter engine's plugin settings (environment) are
        # then the ones in force while both run.
        plain = None
        if "none" in modes:
            plain = stack.enter_context(plugin_engine(**plain_args))
        drafter = stack.enter_context(plugin_engine(**drafter_args))
        result.features = engine_features(drafter)

        # Fresh random prompts for every rep: no prefix-cache hit makes a rep cheaper.
        def prompts():
            return [[rng.randrange(10, vocab) for _ in range(prompt_tokens)] for _ in range(num_prompts)]

        probes = {"drafter": RepProbe(drafter.engine_pids, drafter.gc_pause_seconds)}
        if plain is not None:
            probes["plain"] = RepProbe(plain.engine_pids, plain.gc_pause_seconds)

        def run(mode: str, count: int = num_prompts):
            batch = prompts()[:count]
            if mode == "none":
                with probes["plain"].rep() as sample:
                    rate, counters = timed_rep(plain, batch, None)
                return rate, counters, sample
            drafter.set_kv_only(mode != "full")
            with probes["drafter"].rep() as sample:
                rate, counters = timed_rep(drafter, batch, "always" if mode == "always" else "auto")
            return rate, counters, sample

        if plain is not None:
            run("none")  # warm-up
        run("auto")  # warm-up
        # Every other mode once, on a few prompts: a path's first use (DFlash's eager K=0
        # path, say) pays its one-time costs here, not in a timed rep (h200-32-diagnostics:
        # `full`'s first rep 12% slower, its GPU idle a fifth of it).
        for mode in dict.fromkeys(m for m in modes if m not in ("auto", "none")):
            run(mode, count=min(num_prompts, WARM_UP_PROMPTS))
        for rep, order in enumerate(rep_orders(modes, reps), 1):
            for mode in order:
                rate, counters, sample = run(mode)
                result.tokens_per_s[mode].append(rate)
                result.diagnostics.setdefault(mode, []).append(sample)
                total = result.counters.setdefault(mode, {})
                for name, value in counters.items():
                    total[name] = total.get(name, 0.0) + value
                preempted = counters.get("vllm:num_preemptions_total", 0.0)
                print(
                    f"  mbt {mbt} rep {rep}/{reps} {mode:6s} {rate:10.0f} tok/s  preemptions {preempted:.0f}  "
                    f"{describe(sample)}",
                    flush=True,
                )
        totals = drafter.counters()
        verified = {
            result: totals[f"pdspec_kv_only_graph_verified_total{{{result}}}"] for result in ("equal", "differ")
        }
        if any(verified.values()):
            result.graph_verified = verified
            print(f"  drafter engine: graph steps checked against vLLM's eager path: {verified}", flush=True)
        # Which processes wrote the drafter engine's metrics (pid-named files): where a counter
        # reads 0, this says whether its engine core wrote here at all (kv_only/h200-prefill-worker).
        print("  drafter engine's metrics files:", [Path(f).name for f in drafter.metrics_files()], flush=True)
    return result


def render(results: list[BenchResult]) -> str:
    modes = [m for m in ("auto", "full", "always", "none") if any(r.tokens_per_s.get(m) for r in results)]
    pairs = [
        (a, b)
        for a, b in (("auto", "always"), ("auto", "full"), ("auto", "none"), ("full", "none"))
        if a in modes and b in modes
    ]
    head = ["mbt"] + [f"{m} tok/s" for m in modes] + [f"{a}/{b} (pairs)" for a, b in pairs]
    head += [f"K=0 / proposals ({m})" for m in modes if m != "none"]
    head += [f"KV-only passes ({m})" for m in modes if m != "none"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        cells = [str(r.mbt)] + [f"{r.median(m):.0f}" for m in modes]
        for a, b in pairs:
            ps = r.pairs_of(a, b)
            cells.append(f"{r.ratio_of(a, b):.3f} ({min(ps):.3f}..{max(ps):.3f})")
        for m in modes:
            if m != "none":
                c = r.counters[m]
                cells.append(f"{c['pdspec_k0_proposals_total']:.0f} / {c['pdspec_proposals_total']:.0f}")
        cells += [f"{r.counters[m].get('pdspec_kv_only_passes_total', 0):.0f}" for m in modes if m != "none"]
        rows.append("| " + " | ".join(cells) + " |")
    built = (
        "as a prefill worker builds them (NixlConnector kv_producer, KV released at once)"
        if any(r.as_prefill_worker for r in results)
        else "bare (no KV connector)"
    )
    features = "; ".join(f"mbt {r.mbt}: " + ", ".join(f"{k} {v}" for k, v in r.features.items()) for r in results)
    return "\n".join([f"Engines built {built}. Drafter engine features: {features}.", "", *rows])


def baseline_lines(results: list[BenchResult]) -> list[str]:
    """One line per size: K=0 (auto) throughput over the no-drafter engine's, medians."""
    return [
        f"mbt {r.mbt}: k0/no-drafter: {r.ratio_of('auto', 'none'):.3f}"
        for r in results
        if r.ratio_of("auto", "none") is not None
    ]


def graph_lines(results: list[BenchResult]) -> list[str]:
    """Where K=0 steps ran as CUDA graph replays (DFlash, V2 runner): how many, per mode,
    and what the test-only verification found (timed reps only; warm-ups not counted)."""
    lines = []
    for r in results:
        for mode, c in r.counters.items():
            replays = c.get("pdspec_kv_only_graph_replays_total", 0)
            if replays:
                lines.append(
                    f"mbt {r.mbt} {mode}: graph replays {replays:.0f} of "
                    f"{c.get('pdspec_k0_proposals_total', 0):.0f} K=0 steps"
                )
        if r.graph_verified:
            lines.append(
                f"mbt {r.mbt}: graph steps' drafter KV against vLLM's eager path: "
                f"{r.graph_verified.get('equal', 0):.0f} equal, {r.graph_verified.get('differ', 0):.0f} differ"
            )
    return lines


def plot(results: list[BenchResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    colors = {"auto": "tab:blue", "full": "tab:orange", "always": "tab:gray", "none": "tab:green"}
    modes = [m for m in colors if any(r.tokens_per_s.get(m) for r in results)]
    for k, mode in enumerate(modes):
        offset = (k - (len(modes) - 1) / 2) * 0.15
        for i, r in enumerate(results):
            ys = r.tokens_per_s.get(mode, [])
            ax.scatter([i + offset] * len(ys), ys, label=mode if i == 0 else None, color=colors[mode])

    def label(r: BenchResult) -> str:
        parts = [f"mbt {r.mbt}"]
        for a, b in (("auto", "always"), ("auto", "none")):
            if r.ratio_of(a, b) is not None:
                parts.append(f"{a}/{b} {r.ratio_of(a, b):.3f}")
        return "\n".join(parts)

    ax.set_xticks(range(len(results)), [label(r) for r in results])
    ax.set_ylabel("prompt tokens/s (each rep)")
    ax.set_title("Prefill-only throughput by mode")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_arguments(parser)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--mbt", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--reps", type=int, default=6, help="timed reps per mode")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["auto", "always"],
        choices=["auto", "always", "full"],
        help="drafter-engine modes; full = K=0 with the KV-only pass off",
    )
    parser.add_argument("--baseline", action="store_true", help="add a no-drafter engine (mode none)")
    parser.add_argument(
        "--as-prefill-worker",
        action="store_true",
        help="build the engines as `pdspec prefill` does: NixlConnector kv_producer, the worker's "
        "options and environment, requests asking for a remote decode, KV released at once",
    )
    parser.add_argument("--out", type=Path, default=Path("loadtest/results"))
    args = parser.parse_args()

    engine_args, vocab = engine_args_from(args)
    modes = list(dict.fromkeys(args.modes + (["none"] if args.baseline else [])))
    worker_args = args if args.as_prefill_worker else None
    results = [
        bench(engine_args, mbt, args.prompts, args.prompt_tokens, args.reps, vocab, modes, worker_args)
        for mbt in args.mbt
    ]
    for r in results:
        print(f"mbt {r.mbt}: engine features {r.features}" + (" (as a prefill worker)" if r.as_prefill_worker else ""))

    table = render(results)
    lines = baseline_lines(results) + graph_lines(results)
    table = "\n".join([table, "", *lines]) if lines else table
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill_bench.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    (args.out / "prefill_bench.md").write_text(table + "\n")
    try:
        plot(results, args.out / "prefill_bench.png")
    except ImportError:
        print("(matplotlib not installed: no plot)", file=sys.stderr)


if __name__ == "__main__":
    main()
