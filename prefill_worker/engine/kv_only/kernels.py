"""The KV-only drafter pass itself: the K and V an EAGLE3 drafter layer writes on a K=0
step, without the rest of its forward (see eagle3.py for where it runs).

A prefill worker's drafts are never used; only the drafter's KV is (NIXL moves it to the
decode worker). With K=0, vLLM still runs the drafter's whole prefill forward: for a
one-layer EAGLE3 drafter that is the fc of the target's hidden states, the embedding, two
RMSNorms, the QKV projection, rotary, attention (which writes K and V into the cache and
then computes an output nobody reads), o_proj, the MLP and the final norm. The pass runs
only what K and V depend on: fc, embedding, the norms, the K and V projections and rotary
on K, then the attention backend's own cache write (`impl.do_kv_cache_update`, the op
vLLM's Attention layer calls before attention on backends whose forward does not write the
cache: CPU_ATTN in 0.32, FLASH_ATTN in 0.33). For a drafter of several layers, all but the
last run in full (their outputs feed the last one's K and V)."""

from __future__ import annotations

import logging
import types
from typing import Any

log = logging.getLogger("pdspec.engine")

KV_ONLY_DRAFTERS = ("Eagle3LlamaForCausalLM",)  # drafter classes whose layer code the pass mirrors


class KvOnlyDrafterPass:
    """Writes exactly the drafter KV its full forward would write, without the rest."""

    def __init__(self, model: Any, compiled: bool = False) -> None:
        """`compiled`: vLLM compiles the drafter (torch.compile), so its full pass runs
        Inductor's fused norms and rotary; the pass then takes vLLM's own fused kernels
        for them (same rounding class, not bitwise). Eager engines get the very modules
        the full forward calls, so their KV is bitwise the full pass's."""
        self.inner = model.model  # the drafter's LlamaModel
        self.last = self.inner.layers[-1]
        attn = self.last.self_attn
        self.attn_layer = attn.attn  # vLLM's Attention: kv_cache, impl, layer_name
        self.q_size, self.kv_size = attn.q_size, attn.kv_size
        self.rotary = _platform_rotary(attn.rotary_emb)
        self.project_kv = _kv_projection(attn.qkv_proj, self.q_size, self.kv_size)
        if self.last.layer_idx == 0:
            self.embeds_norm = _fused_rms_norm(self.last.input_layernorm) if compiled else self.last.input_layernorm
            self.hidden_norm = _fused_rms_norm(self.last.hidden_norm) if compiled else self.last.hidden_norm

    @staticmethod
    def unsupported_reason(model: Any) -> str | None:
        """Why the pass cannot stand in for this drafter's forward (None: it can)."""
        name = type(model).__name__
        if name not in KV_ONLY_DRAFTERS:
            return f"drafter class {name} (supported: {', '.join(KV_ONLY_DRAFTERS)})"
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if not layers:
            return "no decoder layers found"
        attn = getattr(layers[-1], "self_attn", None)
        layer = getattr(attn, "attn", None)
        for holder, attr in ((attn, "qkv_proj"), (attn, "rotary_emb"), (attn, "q_size"), (layer, "impl")):
            if not hasattr(holder, attr):
                return f"drafter attention has no {attr}"
        if not hasattr(layer.impl, "do_kv_cache_update"):
            return f"attention backend {type(layer.impl).__name__} has no separate cache write"
        if getattr(layer.attn_backend, "forward_includes_kv_cache_update", True):
            return f"attention backend {type(layer.impl).__name__} writes the cache inside attention"
        if getattr(layer, "kv_sharing_target_layer_name", None) is not None:
            return "the drafter layer shares another layer's KV cache"
        if getattr(inner, "norm_output", False) and len(layers) > 1:
            return "norm_output drafters of several layers"
        if getattr(layers[-1], "layer_idx", None) == 0 and not hasattr(layers[-1], "hidden_norm"):
            return "first drafter layer has no hidden_norm"
        return None

    def run(self, input_ids: Any, positions: Any, hidden_states: Any, slot_mapping: Any) -> None:
        """`hidden_states`: the fc's output (what the full forward receives), one row per
        token; `slot_mapping`: the drafter layer's cache slots for those tokens."""
        import torch

        embeds = self.inner.embed_input_ids(input_ids)
        residual = None
        for layer in self.inner.layers[:-1]:  # as LlamaModel.forward runs them
            hidden_states, residual = layer(
                positions=positions, embeds=embeds, hidden_states=hidden_states, residual=residual
            )
        last = self.last
        if last.layer_idx == 0:  # as the EAGLE3 decoder layer's forward builds its input
            # (`_residual_norm` is hidden_norm, before or after keeping the residual,
            # which only the layers after attention read)
            x = torch.cat([self.embeds_norm(embeds), self.hidden_norm(hidden_states)], dim=-1)
        else:
            x, _ = last.input_layernorm(hidden_states, residual)
        key, value = self.project_kv(x)
        key, _ = self.rotary(positions, key)  # rotary works per head: K alone as the "query"
        layer = self.attn_layer
        layer.impl.do_kv_cache_update(
            layer,
            key.view(-1, layer.num_kv_heads, layer.head_size),
            value.view(-1, layer.num_kv_heads, layer.head_size_v),
            layer.kv_cache,
            slot_mapping,
        )


def _platform_rotary(rotary: Any) -> Any:
    """vLLM's rotary kernel for this platform (C++ on the CPU, CUDA on GPUs), called
    directly. An eager engine's module dispatches to it anyway; a compiling engine's
    dispatches to the PyTorch-native code meant to be fused inside its compiled graph,
    about a dozen separate ops when called alone, as here. A rotary class that changes
    `forward` itself keeps its own."""
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    from vllm.platforms import current_platform

    method = "forward_cpu" if current_platform.is_cpu() else "forward_cuda" if current_platform.is_cuda() else None
    cls = type(rotary)
    own = (
        method is not None
        and isinstance(rotary, RotaryEmbedding)
        and cls.forward_native is RotaryEmbedding.forward_native
        and getattr(cls, method) is getattr(RotaryEmbedding, method)
    )
    return getattr(rotary, method) if own else rotary


def _fused_rms_norm(norm: Any) -> Any:
    """vLLM's RMSNorm kernel (`torch.ops._C.rms_norm`, one pass over the row) in place of
    the module, whose forward on the CPU build is always the PyTorch-native one (five
    ops). Only for a plain RMSNorm with a weight of the input's dtype; anything else keeps
    the module."""
    import torch
    from vllm.model_executor.layers.layernorm import RMSNorm

    try:
        kernel = torch.ops._C.rms_norm
    except (AttributeError, RuntimeError):
        return norm
    if type(norm) is not RMSNorm or not norm.has_weight or norm.variance_size_override is not None:
        return norm

    def rms_norm(x):
        weight = norm.weight.data  # read per call: a weight reload replaces the Parameter
        if x.dtype != weight.dtype or not x.is_contiguous():
            return norm(x)
        out = torch.empty_like(x)
        kernel(out, x, weight, norm.variance_epsilon)
        return out

    return rms_norm


def _engine_compiles(proposer: Any) -> bool:
    config = getattr(getattr(proposer, "vllm_config", None), "compilation_config", None)
    return int(getattr(config, "mode", 0) or 0) != 0  # CompilationMode.NONE is 0


def _kv_projection(qkv_proj: Any, q_size: int, kv_size: int):
    """K and V from the fused QKV projection, multiplying only the weight's K and V rows:
    sliced from the weight where it is a plain unquantized tensor (GPU builds), or read
    back from the packed layer on the CPU build. Otherwise the whole projection runs and
    Q is thrown away."""
    import torch

    weight = getattr(qkv_proj, "weight", None)
    plain = (
        type(getattr(qkv_proj, "quant_method", None)).__name__ == "UnquantizedLinearMethod"
        and weight is not None
        and weight.dim() == 2
        and weight.shape[0] == q_size + 2 * kv_size
    )
    if plain:
        kv_weight = weight[q_size:]
        bias = getattr(qkv_proj, "bias", None)
        kv_bias = bias[q_size:] if bias is not None else None

        def project(x):
            return torch.nn.functional.linear(x, kv_weight, kv_bias).split([kv_size, kv_size], dim=-1)

        return project

    repacked = _repacked_kv_linear(qkv_proj, q_size, kv_size)
    if repacked is not None:

        def project_repacked(x):
            return repacked(x).split([kv_size, kv_size], dim=-1)

        return project_repacked

    def project_full(x):
        qkv, _ = qkv_proj(x)
        _, key, value = qkv.split([q_size, kv_size, kv_size], dim=-1)
        return key, value

    return project_full


def _repacked_kv_linear(qkv_proj: Any, q_size: int, kv_size: int):
    """CPU build: vLLM packed the QKV weight for oneDNN and dropped it. Read it back
    through the layer itself (the identity matrix as input gives W^T exactly: each output
    is one weight times 1 plus zeros), keep its K and V rows, and pack those as vLLM packs
    any linear layer (`dispatch_cpu_unquantized_gemm`). Checked against the layer on a
    random input; None (the whole projection then runs) where any of it does not hold."""
    import torch

    if getattr(qkv_proj, "cpu_linear", None) is None or getattr(qkv_proj, "bias", None) is not None:
        return None
    if type(getattr(qkv_proj, "quant_method", None)).__name__ != "UnquantizedLinearMethod":
        return None
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        in_features, dtype = int(qkv_proj.input_size), qkv_proj.params_dtype
        weight_t, _ = qkv_proj(torch.eye(in_features, dtype=dtype))
        if weight_t.shape != (in_features, q_size + 2 * kv_size):
            return None
        holder = types.SimpleNamespace(weight=weight_t[:, q_size:].t().contiguous(), bias=None)
        dispatch_cpu_unquantized_gemm(holder, remove_weight=False)
        probe = torch.randn(8, in_features, dtype=dtype)
        expected, _ = qkv_proj(probe)
        got = holder.cpu_linear(probe, holder.weight, None)
        if not torch.allclose(got.float(), expected[:, q_size:].float(), rtol=1e-3, atol=1e-4):
            log.warning("pdspec: K/V rows read back from the packed QKV weight do not match; using the full QKV")
            return None
    except Exception as exc:  # any surprise in vLLM's CPU GEMM internals: keep the full projection
        log.warning("pdspec: no K/V-only projection on this build (%s); using the full QKV", exc)
        return None
    return lambda x: holder.cpu_linear(x, holder.weight, None)
