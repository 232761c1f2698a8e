"""Shapes of the small target and its EAGLE3 drafter, in one place."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TargetShape:
    vocab_size: int = 4096
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6


@dataclass(frozen=True)
class DrafterShape:
    # The drafter reads the residual stream after these target layers (EAGLE3 features).
    aux_layer_ids: tuple[int, ...] = (1, 2, 3)
    intermediate_size: int = 512


@dataclass(frozen=True)
class ModelSpec:
    target: TargetShape = field(default_factory=TargetShape)
    drafter: DrafterShape = field(default_factory=DrafterShape)
    corpus_bytes: int = 3_000_000
    seed: int = 0
