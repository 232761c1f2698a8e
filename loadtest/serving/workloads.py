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


# 1P1D and colocated alike prefill in chunks of 2,048, so the two differ in disaggregation only.
LATENCY_MBT = {"mbt2048": {"prefill.max_num_batched_tokens": 2048, "colocated.max_num_batched_tokens": 2048}}
# The in_core_worker engine feature on both workers, and off (vLLM's worker process runs the model).
IN_CORE_ARMS: dict[str, dict[str, object]] = {
    "in_core": {},
    "worker_process": {"prefill.in_core_worker": False, "decode.in_core_worker": False},
}
ABBA_ROUNDS = (("in_core", "worker_process"), ("worker_process", "in_core")) * 2  # ABBAABBA
SEED_MBT = {"mbt512": {"prefill.max_num_batched_tokens": 512}, "mbt2048": {"prefill.max_num_batched_tokens": 2048}}

WORKLOADS: dict[str, Workload] = {
    "seed": Workload(
        "The seed's 1P1D table: through the proxy, 3 phases per drafts policy (auto / always "
        "interleaved) of 128 random 8,192-token prompts at concurrency 32, max_tokens 8; the "
        "prefill worker at max_num_batched_tokens 512 and 2048 (one stack each).",
        (
            "--input-len",
            "8192",
            "--output-len",
            "8",
            "--num-prompts",
            "128",
            "--concurrency",
            "32",
            "--phases",
            "3",
            "--ab",
            "--warmup",
            "32",
        ),
        SEED_MBT,
    ),
    "latency": Workload(
        "TTFT and inter-token latency against concurrency (1, 4, 16, 32): 32 random 4,096-token "
        "prompts per level, 64 output tokens each; prefill chunks of 2,048 tokens (the 1P1D "
        "prefill worker's and the colocated server's max_num_batched_tokens alike, so the two "
        "differ in disaggregation only). Run on a 1P1D and a colocated profile to compare.",
        (
            "--input-len",
            "4096",
            "--output-len",
            "64",
            "--num-prompts",
            "32",
            "--concurrency",
            "1",
            "4",
            "16",
            "32",
            "--warmup",
            "8",
        ),
        LATENCY_MBT,
    ),
    "cpu-seed": Workload(
        "The seed preset scaled to the 2-core CPU and the local model (max_model_len 2048): 3 "
        "phases per policy of 24 random 2,000-token prompts at concurrency 8, max_tokens 8; "
        "prefill mbt 512 and 2048.",
        (
            "--input-len",
            "2000",
            "--output-len",
            "8",
            "--num-prompts",
            "24",
            "--concurrency",
            "8",
            "--phases",
            "3",
            "--ab",
            "--warmup",
            "4",
        ),
        SEED_MBT,
    ),
    "cpu-latency": Workload(
        "The latency workload scaled to the CPU: 8 random 512-token prompts per level at "
        "concurrency 1, 2 and 4, 32 output tokens each; prefill chunks of 2,048 tokens.",
        (
            "--input-len",
            "512",
            "--output-len",
            "32",
            "--num-prompts",
            "8",
            "--concurrency",
            "1",
            "2",
            "4",
            "--warmup",
            "2",
        ),
        LATENCY_MBT,
    ),
    "cpu-tiny": Workload(
        "A few seconds of work for tests: 1 phase per policy of 4 random 600-token prompts at "
        "concurrency 2, max_tokens 4.",
        (
            "--input-len",
            "600",
            "--output-len",
            "4",
            "--num-prompts",
            "4",
            "--concurrency",
            "2",
            "--phases",
            "1",
            "--ab",
        ),
    ),
    "cpu-in-core": Workload(
        "The in_core_worker A/B on the local 1P1D: each stack's start (`ready_s`) and its TTFT and "
        "inter-token latency at concurrency 1 and 4 (12 random 512-token prompts a level, 32 output "
        "tokens), with the model in the engine core (in_core) and in vLLM's worker process "
        "(worker_process), four stacks each in the order ABBAABBA so drift hits both alike; give all "
        "stacks one engine cache (--set prefill.engine_cache_dir=DIR decode.engine_cache_dir=DIR) and "
        "leave the first stack's start, which fills it, out.",
        (
            "--input-len",
            "512",
            "--output-len",
            "32",
            "--num-prompts",
            "12",
            "--concurrency",
            "1",
            "4",
            "--warmup",
            "2",
        ),
        {f"{arm}_{round_}": IN_CORE_ARMS[arm] for round_, pair in enumerate(ABBA_ROUNDS, start=1) for arm in pair},
    ),
}
