"""K=0 equivalence harness: `auto` against `always` on one engine, greedy.

The seed's case: long prompts chunked at max_num_batched_tokens=512 with max_tokens 1,
2 or 64, run alone and then mixed with short decode requests. For each scenario both
policies run on the same engine; the outputs must be equal (N/N) and vLLM's spec-decode
counters identical, while `auto` proposes with K=0 in some steps.

    python -m loadtest.k0_equivalence              # full size: 24 long + 32 short
    python -m loadtest.k0_equivalence --long 6 --short 8 --long-tokens 1200   # CI size
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtest.engine_bench.engines import delta, plugin_engine

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


@dataclass
class ScenarioResult:
    scenario: str
    requests: int
    equal_outputs: int
    spec_counters_auto: dict
    spec_counters_always: dict
    proposals_auto: float
    k0_auto: float
    proposals_always: float
    k0_always: float

    @property
    def passed(self) -> bool:
        return (
            self.equal_outputs == self.requests
            and self.spec_counters_auto == self.spec_counters_always
            and self.k0_always == 0
            and self.k0_auto > 0
        )


def make_requests(num_long: int, num_short: int, long_tokens: int, vocab: int, seed: int = 0):
    """Token-id prompts: long ones with max_tokens cycling 1, 2, 64; short decode ones."""
    rng = random.Random(seed)
    long_prompts = [[rng.randrange(10, vocab) for _ in range(long_tokens)] for _ in range(num_long)]
    long_max = [(1, 2, 64)[i % 3] for i in range(num_long)]
    short_prompts = [[rng.randrange(10, vocab) for _ in range(rng.randrange(8, 48))] for _ in range(num_short)]
    short_max = [48] * num_short
    return (long_prompts, long_max), (short_prompts, short_max)


def run_policy(engine, prompts, max_tokens, policy: str):
    from vllm import SamplingParams, TokensPrompt

    engine.set_policy(policy)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    before = engine.counters()
    outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    counters = delta(engine.counters(), before)
    return [list(o.outputs[0].token_ids) for o in outputs], counters


def run_scenario(engine, name: str, prompts, max_tokens) -> ScenarioResult:
    auto_out, auto_counters = run_policy(engine, prompts, max_tokens, "auto")
    always_out, always_counters = run_policy(engine, prompts, max_tokens, "always")
    return ScenarioResult(
        scenario=name,
        requests=len(prompts),
        equal_outputs=sum(a == b for a, b in zip(auto_out, always_out)),
        spec_counters_auto={k: auto_counters[k] for k in SPEC_COUNTERS},
        spec_counters_always={k: always_counters[k] for k in SPEC_COUNTERS},
        proposals_auto=auto_counters["pdspec_proposals_total"],
        k0_auto=auto_counters["pdspec_k0_proposals_total"],
        proposals_always=always_counters["pdspec_proposals_total"],
        k0_always=always_counters["pdspec_k0_proposals_total"],
    )


def render_table(results: list[ScenarioResult]) -> str:
    rows = [
        "| scenario | outputs equal | drafts (auto / always) | draft tokens | accepted | K=0 proposals (auto) | K=0 (always) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        a, b = r.spec_counters_auto, r.spec_counters_always
        rows.append(
            f"| {r.scenario} | {r.equal_outputs}/{r.requests} "
            f"| {a['vllm:spec_decode_num_drafts_total']:.0f} / {b['vllm:spec_decode_num_drafts_total']:.0f} "
            f"| {a['vllm:spec_decode_num_draft_tokens_total']:.0f} / {b['vllm:spec_decode_num_draft_tokens_total']:.0f} "
            f"| {a['vllm:spec_decode_num_accepted_tokens_total']:.0f} / "
            f"{b['vllm:spec_decode_num_accepted_tokens_total']:.0f} "
            f"| {r.k0_auto:.0f} / {r.proposals_auto:.0f} | {r.k0_always:.0f} / {r.proposals_always:.0f} |"
        )
    return "\n".join(rows)


def run(models_dir: Path, num_long: int, num_short: int, long_tokens: int, mbt: int = 512) -> list[ScenarioResult]:
    vocab = json.loads((models_dir / "target" / "config.json").read_text())["vocab_size"]
    (long_p, long_m), (short_p, short_m) = make_requests(num_long, num_short, long_tokens, vocab)
    with plugin_engine(
        models_dir, max_num_batched_tokens=mbt, max_model_len=long_tokens + 128, enforce_eager=True
    ) as engine:
        run_policy(engine, short_p[:2], short_m[:2], "auto")  # warm-up
        return [
            run_scenario(engine, "long alone", long_p, long_m),
            run_scenario(engine, "long + short", long_p + short_p, long_m + short_m),
        ]


def main() -> None:
    from pdspec.settings import ModelSettings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=ModelSettings().models_dir)
    parser.add_argument("--long", type=int, default=24)
    parser.add_argument("--short", type=int, default=32)
    parser.add_argument("--long-tokens", type=int, default=2048)
    parser.add_argument("--mbt", type=int, default=512)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = run(args.models_dir, args.long, args.short, args.long_tokens, args.mbt)
    print(render_table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    sys.exit(0 if all(r.passed for r in results) else 1)


if __name__ == "__main__":
    main()
