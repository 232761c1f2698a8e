"""Prefill-only benchmark: K=0 (`auto`) against drafting every step (`always`).

One engine per max_num_batched_tokens; on each, a warm-up, then timed reps with the
two policies interleaved (auto, always, always, auto, ...) on the same engine, so
drift on a noisy machine hits both alike. Reported: prompt tokens/s per rep, the
auto/always ratio of medians and of each adjacent pair (spread), and the counters.

    python -m loadtest.prefill_bench                          # CPU: 32 x 2048 tokens, mbt 512 and 2048
    python -m loadtest.prefill_bench --target /models/Qwen3-8B --drafter /models/eagle3 \\
        --prompts 64 --prompt-tokens 16384 --mbt 512 --dummy  # GPU (random weights)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadtest.engine import delta, plugin_engine


@dataclass
class BenchResult:
    mbt: int
    prompts: int
    prompt_tokens: int
    tokens_per_s: dict[str, list[float]] = field(default_factory=lambda: {"auto": [], "always": []})
    counters: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return statistics.median(self.tokens_per_s["auto"]) / statistics.median(self.tokens_per_s["always"])

    @property
    def pair_ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.tokens_per_s["auto"], self.tokens_per_s["always"])]


def timed_rep(engine, prompts, policy: str) -> tuple[float, dict]:
    from vllm import SamplingParams, TokensPrompt

    engine.set_policy(policy)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    before = engine.counters()
    start = time.perf_counter()
    engine.llm.generate(inputs, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(map(len, prompts)) / elapsed, delta(engine.counters(), before)


def bench(engine_args: dict, mbt: int, num_prompts: int, prompt_tokens: int, reps: int, vocab: int) -> BenchResult:
    rng = random.Random(mbt)
    result = BenchResult(mbt, num_prompts, prompt_tokens)
    with plugin_engine(max_num_batched_tokens=mbt, max_model_len=prompt_tokens + 16, **engine_args) as engine:
        # Fresh random prompts for every rep: no prefix-cache hit makes a rep cheaper.
        def prompts():
            return [[rng.randrange(10, vocab) for _ in range(prompt_tokens)] for _ in range(num_prompts)]

        timed_rep(engine, prompts(), "auto")  # warm-up
        order = ["auto", "always", "always", "auto"] * ((reps + 1) // 2)
        for i, policy in enumerate(order[: 2 * reps]):
            rate, counters = timed_rep(engine, prompts(), policy)
            result.tokens_per_s[policy].append(rate)
            total = result.counters.setdefault(policy, {})
            for name, value in counters.items():
                total[name] = total.get(name, 0.0) + value
            print(f"  mbt {mbt} rep {i // 2 + 1}/{reps} {policy:6s} {rate:10.0f} tok/s", flush=True)
    return result


def render(results: list[BenchResult]) -> str:
    rows = [
        "| mbt | always tok/s (median) | auto tok/s (median) | auto/always | pair ratios min..max "
        "| K=0 / proposals (auto) | K=0 / proposals (always) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        auto, always = r.counters["auto"], r.counters["always"]
        rows.append(
            f"| {r.mbt} | {statistics.median(r.tokens_per_s['always']):.0f} "
            f"| {statistics.median(r.tokens_per_s['auto']):.0f} | {r.ratio:.3f} "
            f"| {min(r.pair_ratios):.3f}..{max(r.pair_ratios):.3f} "
            f"| {auto['pdspec_k0_proposals_total']:.0f} / {auto['pdspec_proposals_total']:.0f} "
            f"| {always['pdspec_k0_proposals_total']:.0f} / {always['pdspec_proposals_total']:.0f} |"
        )
    return "\n".join(rows)


def plot(results: list[BenchResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for offset, policy in ((-0.15, "always"), (0.15, "auto")):
        for i, r in enumerate(results):
            ys = r.tokens_per_s[policy]
            ax.scatter([i + offset] * len(ys), ys, label=policy if i == 0 else None,
                       color="tab:gray" if policy == "always" else "tab:blue")  # fmt: skip
    ax.set_xticks(range(len(results)), [f"mbt {r.mbt}\nauto/always {r.ratio:.3f}" for r in results])
    ax.set_ylabel("prompt tokens/s (each rep)")
    ax.set_title("Prefill-only throughput: K=0 (auto) vs drafting (always)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    from pdspec.settings import ModelSettings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=ModelSettings().models_dir)
    parser.add_argument("--target")
    parser.add_argument("--drafter")
    parser.add_argument("--method", default="eagle3")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--mbt", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--reps", type=int, default=6, help="timed reps per policy")
    parser.add_argument("--dummy", action="store_true", help="random weights, no tokenizer (GPU shapes)")
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("loadtest/results"))
    args = parser.parse_args()

    target = args.target or str(args.models_dir / "target")
    drafter = args.drafter or str(args.models_dir / "eagle3")
    vocab = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    engine_args = dict(target=target, drafter=drafter, method=args.method, k=args.k, enforce_eager=args.eager)
    if args.dummy:
        engine_args.update(load_format="dummy", skip_tokenizer_init=True)
    results = [bench(engine_args, mbt, args.prompts, args.prompt_tokens, args.reps, vocab) for mbt in args.mbt]

    table = render(results)
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
