"""Build the local model pair: tokenizer + Qwen3 target + EAGLE3 drafter.

Deterministic: the same seed, corpus and shapes give byte-identical weights. The pair is
written into `<models_dir>/target` and `<models_dir>/eagle3`, with a `pdspec-model.json`
stamp that records how it was made; a folder whose stamp matches is reused.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from pdspec.models.paths import local_drafter_dir as drafter_dir
from pdspec.models.paths import local_target_dir as target_dir
from pdspec.models.shapes import ModelSpec
from pdspec.models.tokenizer import save_tokenizer, train_tokenizer

log = logging.getLogger(__name__)

STAMP = "pdspec-model.json"
FORMAT_VERSION = 1


def _stamp(spec: ModelSpec) -> dict:
    return {"format": FORMAT_VERSION, "spec": asdict(spec)}


def is_built(models_dir: Path, spec: ModelSpec | None = None) -> bool:
    stamp = models_dir / STAMP
    if not stamp.exists():
        return False
    return json.loads(stamp.read_text()) == json.loads(json.dumps(_stamp(spec or ModelSpec())))


def target_config(spec: ModelSpec, eos_id: int, pad_id: int) -> Qwen3Config:
    t = spec.target
    return Qwen3Config(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        num_hidden_layers=t.num_hidden_layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim,
        intermediate_size=t.intermediate_size,
        max_position_embeddings=t.max_position_embeddings,
        rope_theta=t.rope_theta,
        rms_norm_eps=t.rms_norm_eps,
        tie_word_embeddings=False,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        torch_dtype="bfloat16",
    )


def drafter_config(spec: ModelSpec, eos_id: int) -> dict:
    t, d = spec.target, spec.drafter
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": t.hidden_size,
        "target_hidden_size": t.hidden_size,
        "intermediate_size": d.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads,
        "head_dim": t.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": t.max_position_embeddings,
        "rms_norm_eps": t.rms_norm_eps,
        "rope_theta": t.rope_theta,
        "vocab_size": t.vocab_size,
        "draft_vocab_size": t.vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(d.aux_layer_ids),
        "tie_word_embeddings": False,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }


def init_drafter_weights(spec: ModelSpec, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random EAGLE3 weights with the tensor names vLLM's Eagle3 loader expects."""
    t, d = spec.target, spec.drafter
    h, hd = t.hidden_size, t.head_dim
    q_out, kv_out = t.num_attention_heads * hd, t.num_key_value_heads * hd

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.02

    weights = {
        "embed_tokens.weight": normal(t.vocab_size, h),
        "fc.weight": normal(h, h * len(d.aux_layer_ids)),
        # The first (only) layer's attention reads [embeds, hidden] concatenated.
        "midlayer.self_attn.q_proj.weight": normal(q_out, 2 * h),
        "midlayer.self_attn.k_proj.weight": normal(kv_out, 2 * h),
        "midlayer.self_attn.v_proj.weight": normal(kv_out, 2 * h),
        "midlayer.self_attn.o_proj.weight": normal(h, q_out),
        "midlayer.mlp.gate_proj.weight": normal(d.intermediate_size, h),
        "midlayer.mlp.up_proj.weight": normal(d.intermediate_size, h),
        "midlayer.mlp.down_proj.weight": normal(h, d.intermediate_size),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "norm.weight": torch.ones(h),
        "lm_head.weight": normal(t.vocab_size, h),
    }
    return {name: w.to(torch.bfloat16).contiguous() for name, w in weights.items()}


def build_models(models_dir: Path, spec: ModelSpec | None = None, force: bool = False) -> Path:
    """Build (or reuse) the model pair under `models_dir`; returns `models_dir`."""
    spec = spec or ModelSpec()
    models_dir = Path(models_dir)
    if not force and is_built(models_dir, spec):
        log.info("models already built in %s", models_dir)
        return models_dir

    staging = models_dir.with_name(models_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    tokenizer = train_tokenizer(spec.target.vocab_size, spec.corpus_bytes)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")

    torch.manual_seed(spec.seed)
    target = Qwen3ForCausalLM(target_config(spec, eos_id, pad_id)).to(torch.bfloat16)
    save_tokenizer(tokenizer, target_dir(staging))
    target.save_pretrained(target_dir(staging), safe_serialization=True)
    generation_config = target_dir(staging) / "generation_config.json"
    generation_config.write_text(json.dumps({"eos_token_id": eos_id, "pad_token_id": pad_id}))

    generator = torch.Generator().manual_seed(spec.seed + 1)
    drafter = drafter_dir(staging)
    drafter.mkdir()
    save_file(init_drafter_weights(spec, generator), drafter / "model.safetensors")
    (drafter / "config.json").write_text(json.dumps(drafter_config(spec, eos_id), indent=2))

    (staging / STAMP).write_text(json.dumps(_stamp(spec), indent=2))
    shutil.rmtree(models_dir, ignore_errors=True)
    staging.rename(models_dir)
    log.info("built models in %s", models_dir)
    return models_dir
