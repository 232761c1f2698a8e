"""Configs of the local model pair (Qwen3 target + EAGLE3 drafter), and its install.

The trained pair ships with pdspec (`pdspec/models/trained/`, made by `train.py`);
`install_models` copies it into a models folder, checking every file against the
manifest, and reuses a folder that already holds exactly those files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from pdspec.models.shapes import ModelSpec

log = logging.getLogger(__name__)

SHIPPED = Path(__file__).resolve().parent / "trained"
MANIFEST = "manifest.json"


def target_config(spec: ModelSpec, eos_id: int, pad_id: int):
    from transformers import Qwen3Config

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


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(pair_dir: Path) -> dict[str, str]:
    files = sorted(p for p in pair_dir.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest = {p.relative_to(pair_dir).as_posix(): sha256(p) for p in files}
    (pair_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def is_installed(models_dir: Path, source: Path = SHIPPED) -> bool:
    installed = Path(models_dir) / MANIFEST
    return installed.exists() and installed.read_text() == (source / MANIFEST).read_text()


def install_models(models_dir: Path, force: bool = False, source: Path = SHIPPED) -> Path:
    """Copy the shipped pair into `models_dir` (seconds); verify every file."""
    models_dir = Path(models_dir)
    if not force and is_installed(models_dir, source):
        log.info("models already installed in %s", models_dir)
        return models_dir
    manifest = json.loads((source / MANIFEST).read_text())
    staging = models_dir.with_name(models_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    for rel, digest in manifest.items():
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, target)
        if sha256(target) != digest:
            raise RuntimeError(f"shipped model file {rel} does not match its manifest")
    shutil.copyfile(source / MANIFEST, staging / MANIFEST)
    shutil.rmtree(models_dir, ignore_errors=True)
    staging.rename(models_dir)
    log.info("installed the trained model pair in %s", models_dir)
    return models_dir
