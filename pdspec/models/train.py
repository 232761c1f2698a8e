"""Train the local model pair so it behaves like a real one (seeded, CPU).

1. The target (Qwen3 architecture) learns next-token prediction on the Python standard
   library's sources, so its greedy continuations look like that code.
2. The EAGLE3 drafter learns the target's own greedy continuations: sequences are
   generated greedily by the trained target from corpus prompts; the drafter reads the
   target's auxiliary-layer features and predicts the target's next choices, unrolled
   over K drafting steps (EAGLE3's training-time test), as vLLM will run it.

    python -m pdspec.models.train --out pdspec/models/trained   # writes the shipped pair
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from pdspec.models.build import drafter_config, target_config
from pdspec.models.corpus import iter_corpus_text
from pdspec.models.eagle3 import Eagle3Drafter
from pdspec.models.shapes import ModelSpec
from pdspec.models.tokenizer import save_tokenizer, train_tokenizer

log = logging.getLogger("pdspec.models.train")


@dataclass(frozen=True)
class TrainPlan:
    target_steps: int = 300
    target_batch: int = 16
    target_seq: int = 256
    target_lr: float = 3e-3
    drafter_sequences: int = 384
    prompt_tokens: int = 32
    generated_tokens: int = 160
    drafter_epochs: int = 6
    drafter_batch: int = 16
    drafter_lr: float = 2e-3
    unroll_steps: int = 3
    seed: int = 0


def encode_corpus(tokenizer, corpus_bytes: int) -> torch.Tensor:
    ids: list[int] = []
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    for text in iter_corpus_text(corpus_bytes):
        ids.extend(tokenizer.encode(text))
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def cosine_lr(step: int, total: int, peak: float, warmup: int = 30) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def train_target(model, data: torch.Tensor, plan: TrainPlan, generator: torch.Generator) -> list[float]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=plan.target_lr, weight_decay=0.01, betas=(0.9, 0.95))
    losses = []
    for step in range(plan.target_steps):
        starts = torch.randint(0, len(data) - plan.target_seq - 1, (plan.target_batch,), generator=generator)
        batch = torch.stack([data[s : s + plan.target_seq + 1] for s in starts.tolist()])
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, plan.target_steps, plan.target_lr)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == plan.target_steps - 1:
            log.info("target step %d/%d loss %.3f", step + 1, plan.target_steps, loss.item())
    model.eval()
    return losses


@torch.no_grad()
def greedy_sequences(model, data: torch.Tensor, plan: TrainPlan, generator: torch.Generator) -> torch.Tensor:
    """Corpus prompts continued greedily by the target: the drafter's training data."""
    starts = torch.randint(0, len(data) - plan.prompt_tokens, (plan.drafter_sequences,), generator=generator)
    prompts = torch.stack([data[s : s + plan.prompt_tokens] for s in starts.tolist()])
    out = []
    for chunk in prompts.split(64):
        generated = model.generate(
            input_ids=chunk,
            attention_mask=torch.ones_like(chunk),
            max_new_tokens=plan.generated_tokens,
            min_new_tokens=plan.generated_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        out.append(generated)
    return torch.cat(out)


@torch.no_grad()
def aux_features(model, sequences: torch.Tensor, layer_ids: tuple[int, ...]) -> torch.Tensor:
    """The residual stream after each aux layer (vLLM's EAGLE3 aux hidden states)."""
    feats = []
    for chunk in sequences.split(32):
        hidden = model(input_ids=chunk, output_hidden_states=True).hidden_states
        feats.append(torch.cat([hidden[i] for i in layer_ids], dim=-1))
    return torch.cat(feats)


def train_drafter(drafter: Eagle3Drafter, sequences, features, plan: TrainPlan, generator) -> list[float]:
    trainable = [p for name, p in drafter.named_parameters() if not name.startswith("embed_tokens")]
    optimizer = torch.optim.AdamW(trainable, lr=plan.drafter_lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(sequences) / plan.drafter_batch)
    total = steps_per_epoch * plan.drafter_epochs
    # Only positions inside the greedy continuation have the target's own choices as labels.
    first_label = plan.prompt_tokens
    weights = [0.8**s for s in range(plan.unroll_steps)]
    losses, step = [], 0
    for epoch in range(plan.drafter_epochs):
        order = torch.randperm(len(sequences), generator=generator)
        for batch_ids in order.split(plan.drafter_batch):
            tokens, feats = sequences[batch_ids], features[batch_ids]
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(step, total, plan.drafter_lr, warmup=10)
            outputs = drafter.unrolled(tokens, feats, plan.unroll_steps)
            loss = torch.zeros(())
            for s, logits in enumerate(outputs):
                rows = logits.shape[1]
                labels = tokens[:, 2 + s : 2 + s + rows].clone()
                positions = torch.arange(2 + s, 2 + s + rows)
                labels[:, positions < first_label] = -100
                loss = loss + weights[s] * F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            losses.append(loss.item())
            step += 1
        log.info("drafter epoch %d/%d loss %.3f", epoch + 1, plan.drafter_epochs, losses[-1])
    return losses


@torch.no_grad()
def draft_accuracy(drafter, sequences, features, plan: TrainPlan) -> list[float]:
    """Per-step top-1 accuracy on held-out sequences (teacher-forced, as in training)."""
    outputs = drafter.unrolled(sequences, features, plan.unroll_steps)
    accuracies = []
    for s, logits in enumerate(outputs):
        rows = logits.shape[1]
        labels = sequences[:, 2 + s : 2 + s + rows]
        mask = torch.arange(2 + s, 2 + s + rows) >= plan.prompt_tokens
        hits = (logits.argmax(-1) == labels)[:, mask]
        accuracies.append(hits.float().mean().item())
    return accuracies


def train_pair(out_dir: Path, spec: ModelSpec, plan: TrainPlan) -> dict:
    from transformers import Qwen3ForCausalLM

    started = time.monotonic()
    random.seed(plan.seed)
    torch.manual_seed(plan.seed)
    generator = torch.Generator().manual_seed(plan.seed)
    tokenizer = train_tokenizer(spec.target.vocab_size, spec.corpus_bytes)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    data = encode_corpus(tokenizer, spec.corpus_bytes)
    log.info("corpus: %d tokens", len(data))

    config = target_config(spec, eos_id, pad_id)
    config.torch_dtype = "float32"
    target = Qwen3ForCausalLM(config)
    target_losses = train_target(target, data, plan, generator)
    target_s = time.monotonic() - started
    # The pair ships as bf16 tensors and is served with float32 compute (config dtype):
    # round the target now, so the drafter learns the features vLLM will compute.
    with torch.no_grad():
        for param in target.parameters():
            param.copy_(param.to(torch.bfloat16).float())

    sequences = greedy_sequences(target, data, plan, generator)
    d_config = drafter_config(spec, eos_id)
    features = aux_features(target, sequences, tuple(d_config["eagle_aux_hidden_state_layer_ids"]))
    held_out = max(16, len(sequences) // 8)
    drafter = Eagle3Drafter(d_config)
    with torch.no_grad():  # start from the target's own embedding and output head
        drafter.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        drafter.lm_head.weight.copy_(target.lm_head.weight)
    drafter.embed_tokens.weight.requires_grad_(False)
    drafter_losses = train_drafter(drafter, sequences[held_out:], features[held_out:], plan, generator)
    accuracy = draft_accuracy(drafter, sequences[:held_out], features[:held_out], plan)
    log.info("held-out draft accuracy per step: %s", [round(a, 3) for a in accuracy])

    out_dir.mkdir(parents=True, exist_ok=True)
    target_out, drafter_out = out_dir / "target", out_dir / "eagle3"
    # bf16 tensors keep the files small; config says float32, which vLLM computes in.
    # This tiny model's greedy choices are sensitive to rounding: bf16 compute halves
    # the drafter's acceptance, float32 compute keeps it.
    target.config.torch_dtype = "float32"
    target.to(torch.bfloat16).save_pretrained(target_out, safe_serialization=True)
    config_path = target_out / "config.json"
    saved = json.loads(config_path.read_text())
    saved["torch_dtype"] = saved["dtype"] = "float32"
    config_path.write_text(json.dumps(saved, indent=2))
    save_tokenizer(tokenizer, target_out)
    (target_out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id, "pad_token_id": pad_id}))
    drafter_out.mkdir(exist_ok=True)
    state = {name: tensor.detach().to(torch.bfloat16).contiguous() for name, tensor in drafter.state_dict().items()}
    save_file(state, drafter_out / "model.safetensors")
    (drafter_out / "config.json").write_text(json.dumps({**d_config, "torch_dtype": "float32"}, indent=2))
    report = {
        "seconds_total": round(time.monotonic() - started, 1),
        "seconds_target": round(target_s, 1),
        "target_loss_first_last": [round(target_losses[0], 3), round(target_losses[-1], 3)],
        "drafter_loss_first_last": [round(drafter_losses[0], 3), round(drafter_losses[-1], 3)],
        "held_out_draft_accuracy": [round(a, 3) for a in accuracy],
        "plan": plan.__dict__,
    }
    (out_dir / "training-report.json").write_text(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target-steps", type=int, default=TrainPlan.target_steps)
    parser.add_argument("--drafter-epochs", type=int, default=TrainPlan.drafter_epochs)
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(message)s")
    torch.set_num_threads(2)
    plan = TrainPlan(target_steps=args.target_steps, drafter_epochs=args.drafter_epochs)
    print(json.dumps(train_pair(args.out, ModelSpec(), plan), indent=2))


if __name__ == "__main__":
    main()
