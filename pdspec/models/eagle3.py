"""A PyTorch EAGLE3 drafter that computes what vLLM's `LlamaForCausalLMEagle3` computes,
for training. Its `state_dict()` uses the checkpoint names vLLM loads (`midlayer.*`).

One decoder layer whose attention reads [norm(embed(token)), norm(hidden)]; `hidden` is
`fc(target aux features)` in the first drafting step and the drafter's own pre-norm
output in later steps. Rotary embeddings are Llama's (rotate-half), attention is GQA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * self.weight.float()).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [batch, heads, T, head_dim]; positions: [T] or [batch, T]."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq  # [.., T, hd/2]
    emb = torch.cat((angles, angles), dim=-1)
    if emb.dim() == 2:
        emb = emb[None, None]
    else:
        emb = emb[:, None]
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, theta: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, head_dim, theta
        self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rope(q, positions, self.theta), rope(k, positions, self.theta)
        repeat = self.heads // self.kv_heads
        return q, k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)

    def attend(self, q, context_k, context_v, extra_k, extra_v) -> torch.Tensor:
        """Query row i attends to context keys 0..i and to row i of each extra key set
        (the keys this drafter wrote at positions i+1, i+2, ... in earlier draft steps)."""
        b, h, t, d = q.shape
        scale = d**-0.5
        scores = torch.matmul(q, context_k.transpose(-1, -2)) * scale  # [b, h, t, t]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        extra_scores = [(q * k).sum(-1, keepdim=True) * scale for k in extra_k]  # [b, h, t, 1] each
        weights = torch.softmax(torch.cat([scores, *extra_scores], dim=-1).float(), dim=-1).to(q.dtype)
        out = torch.matmul(weights[..., :t], context_v)
        for i, v in enumerate(extra_v):
            out = out + weights[..., t + i : t + i + 1] * v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class Eagle3Drafter(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        h, eps = config["hidden_size"], config["rms_norm_eps"]
        n_aux = len(config["eagle_aux_hidden_state_layer_ids"])
        self.embed_tokens = nn.Embedding(config["vocab_size"], h)
        self.fc = nn.Linear(config["target_hidden_size"] * n_aux, h, bias=False)
        self.midlayer = nn.Module()
        self.midlayer.input_layernorm = RMSNorm(h, eps)
        self.midlayer.hidden_norm = RMSNorm(h, eps)
        self.midlayer.self_attn = Attention(
            h, config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"], config["rope_theta"]
        )
        self.midlayer.post_attention_layernorm = RMSNorm(h, eps)
        self.midlayer.mlp = nn.Module()
        inter = config["intermediate_size"]
        self.midlayer.mlp.gate_proj = nn.Linear(h, inter, bias=False)
        self.midlayer.mlp.up_proj = nn.Linear(h, inter, bias=False)
        self.midlayer.mlp.down_proj = nn.Linear(inter, h, bias=False)
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, config["draft_vocab_size"], bias=False)

    def layer_inputs(self, tokens: torch.Tensor, hidden: torch.Tensor):
        layer = self.midlayer
        embeds = layer.input_layernorm(self.embed_tokens(tokens))
        residual = hidden  # vLLM's default "norm after residual"
        return torch.cat([embeds, layer.hidden_norm(hidden)], dim=-1), residual

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor):
        layer = self.midlayer
        residual = attn_out + residual
        x = layer.post_attention_layernorm(residual)
        x = layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x))
        prenorm = x + residual
        return self.lm_head(self.norm(prenorm)), prenorm

    def unrolled(self, tokens: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: the logits of `steps` drafting steps at every position.

        tokens: [b, T] the sequence; features: [b, T, n_aux * target_hidden].
        Step s (0-based) at row i sits at position i + s, reads token i + 1 + s and
        predicts token i + 2 + s; its hidden input is fc(features[i]) for s = 0 and the
        previous step's pre-norm output otherwise. Teacher forcing on tokens: a draft
        matters only while it is right, and then it equals the true token.
        """
        b, t = tokens.shape
        rows = t - 1 - steps  # rows whose labels exist for every step
        attn = self.midlayer.self_attn
        hidden = self.fc(features[:, :rows])
        context_k = context_v = None
        extra_k: list[torch.Tensor] = []
        extra_v: list[torch.Tensor] = []
        outputs = []
        for s in range(steps):
            x, residual = self.layer_inputs(tokens[:, 1 + s : 1 + s + rows], hidden)
            positions = torch.arange(s, s + rows)
            q, k, v = attn.qkv(x, positions)
            if s == 0:
                context_k, context_v = k, v
                out = attn.attend(q, k, v, [], [])
            else:
                extra_k.append(k)
                extra_v.append(v)
                out = attn.attend(q, context_k, context_v, extra_k, extra_v)
            logits, hidden = self.finish(out, residual)
            outputs.append(logits)
        return outputs
