"""A DFlash drafter of the small target's shape, with seeded random weights.

Untrained: it drafts noise, so it says nothing about acceptance. It exists so the DFlash
K=0 mechanics (pdspec's KV-only pass on vLLM's V1 runner, the K=0 rule, the transfer of
its context K/V) run on the CPU, on the shipped target, in tests and by hand:

    python -m pdspec.models.dflash OUT_DIR [--k 4]

Real weights, not `load_format="dummy"`: vLLM builds a DFlash drafter's fused K/V weight
when it loads the checkpoint, and with dummy weights on the CPU build it builds it later
from the repacked linear weights, which fails. The checkpoint names are the published
DFlash checkpoints' (`layers.N.self_attn.q_proj`, `fc`, `hidden_norm`); embeddings and
LM head come from the target, as vLLM shares them when the drafter has none.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pdspec.models.shapes import DrafterShape, TargetShape

DFLASH_LAYERS = 2


def dflash_config(target: TargetShape, drafter: DrafterShape, k: int) -> dict:
    """The drafter's config.json: DFlash's layout, the target's sizes, K = `block_size`."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": k,
        "num_target_layers": target.num_hidden_layers,
        # The mask token must be inside the vocabulary; the last id is never a real token here.
        "dflash_config": {"mask_token_id": target.vocab_size - 1, "target_layer_ids": list(drafter.aux_layer_ids)},
        "hidden_size": target.hidden_size,
        "intermediate_size": drafter.intermediate_size,
        "num_hidden_layers": DFLASH_LAYERS,
        "num_attention_heads": target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": target.max_position_embeddings,
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "vocab_size": target.vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }


def write_dflash_drafter(out_dir: Path, k: int = 4, seed: int = 0) -> Path:
    """Writes config.json and model.safetensors for the small target's DFlash drafter."""
    import torch
    from safetensors.torch import save_file

    target, drafter = TargetShape(), DrafterShape()
    config = dflash_config(target, drafter, k)
    generator = torch.Generator().manual_seed(seed)

    def weight(*shape: int, scale: float = 0.05) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    def norm(size: int) -> torch.Tensor:
        return 1.0 + weight(size)

    hidden, heads, kv_heads, head_dim = (
        target.hidden_size,
        target.num_attention_heads,
        target.num_key_value_heads,
        target.head_dim,
    )
    tensors = {
        "norm.weight": norm(hidden),
        "hidden_norm.weight": norm(hidden),
        "fc.weight": weight(hidden, hidden * len(drafter.aux_layer_ids)),
    }
    for i in range(DFLASH_LAYERS):
        p = f"layers.{i}."
        tensors.update(
            {
                p + "self_attn.q_proj.weight": weight(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": weight(kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": weight(kv_heads * head_dim, hidden),
                p + "self_attn.o_proj.weight": weight(hidden, heads * head_dim),
                p + "self_attn.q_norm.weight": norm(head_dim),
                p + "self_attn.k_norm.weight": norm(head_dim),
                p + "input_layernorm.weight": norm(hidden),
                p + "post_attention_layernorm.weight": norm(hidden),
                p + "mlp.gate_proj.weight": weight(drafter.intermediate_size, hidden),
                p + "mlp.up_proj.weight": weight(drafter.intermediate_size, hidden),
                p + "mlp.down_proj.weight": weight(hidden, drafter.intermediate_size),
            }
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({name: t.float().contiguous() for name, t in tensors.items()}, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--k", type=int, default=4, help="draft tokens a step (DFlash's block_size)")
    args = parser.parse_args()
    print(write_dflash_drafter(args.out_dir, args.k))


if __name__ == "__main__":
    main()
