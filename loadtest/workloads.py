"""Named workloads for `pdspec bench`: serve_bench arguments, and the stack variants
(settings overrides) to run them on, one stack per variant."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Workload:
    description: str
    serve_args: tuple[str, ...]
    # name -> settings overrides ("prefill.max_num_batched_tokens" -> 512) of one stack each
    variants: dict[str, dict[str, object]] = field(default_factory=lambda: {"default": {}})


SEED_MBT = {"mbt512": {"prefill.max_num_batched_tokens": 512}, "mbt2048": {"prefill.max_num_batched_tokens": 2048}}

WORKLOADS: dict[str, Workload] = {
    "seed": Workload(
        "The seed's 1P1D table: through the proxy, 3 phases per drafts policy (auto / always "
        "interleaved) of 128 random 8,192-token prompts at concurrency 32, max_tokens 8; the "
        "prefill worker at max_num_batched_tokens 512 and 2048 (one stack each).",
        ("--input-len", "8192", "--output-len", "8", "--num-prompts", "128", "--concurrency", "32",
         "--phases", "3", "--ab", "--warmup", "32"),  # fmt: skip
        SEED_MBT,
    ),
    "latency": Workload(
        "TTFT and inter-token latency against concurrency (1, 4, 16, 32): 64 random 4,096-token "
        "prompts per level, 128 output tokens each. Run on a 1P1D and a colocated profile to compare.",
        ("--input-len", "4096", "--output-len", "128", "--num-prompts", "64", "--concurrency", "1", "4", "16", "32",
         "--warmup", "8"),  # fmt: skip
    ),
    "cpu-seed": Workload(
        "The seed preset scaled to the 2-core CPU and the local model: 2 phases per policy of 8 "
        "random 1,536-token prompts at concurrency 4, max_tokens 8; prefill mbt 512 and 2048.",
        ("--input-len", "1536", "--output-len", "8", "--num-prompts", "8", "--concurrency", "4",
         "--phases", "2", "--ab", "--warmup", "2"),  # fmt: skip
        SEED_MBT,
    ),
    "cpu-tiny": Workload(
        "A few seconds of work for tests: 1 phase per policy of 4 random 600-token prompts at "
        "concurrency 2, max_tokens 4.",
        ("--input-len", "600", "--output-len", "4", "--num-prompts", "4", "--concurrency", "2", "--phases", "1",
         "--ab"),  # fmt: skip
    ),
}
