"""Synthetic engine profiles for the planner's unit tests (tests/unit/plan/): made-up curves
built in the test, never a measured one (a test must not move when a shipped profile is
added or re-measured), each shaped so a test's expectation can be worked out by hand."""

from __future__ import annotations

from pdspec.plan.profile import SCHEMA, EngineProfile

Points = list[tuple[float, float]]


def synthetic(
    *,
    prefill: Points = ((16, 10.0), (2048, 60.0)),
    budget: int = 2048,
    decode: dict[int, tuple[Points, float]] | None = None,
    transfer: Points = ((16, 1.0), (4096, 20.0)),
    kv_tokens: int = 1_000_000,
    gpu: str = "synthetic-gpu",
) -> EngineProfile:
    """A profile with these curves; `decode` maps K to (step_ms points, tokens_per_step)."""
    if decode is None:
        decode = {0: ([(1, 10.0), (256, 40.0)], 1.0), 3: ([(1, 14.0), (256, 60.0)], 2.5)}
    return EngineProfile.model_validate(
        {
            "schema": SCHEMA,
            "model_shape": "synthetic",
            "drafter": "synthetic",
            "gpu": gpu,
            "vllm_version": "none",
            "measured": "never: made up for a unit test",
            "prefill": {"max_num_batched_tokens": budget, "step_ms": {"points": list(prefill)}},
            "decode": {
                k: {"step_ms": {"points": list(points)}, "tokens_per_step": tps} for k, (points, tps) in decode.items()
            },
            "transfer_ms": {"points": list(transfer)},
            "kv_tokens": kv_tokens,
        }
    )
