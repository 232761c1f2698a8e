"""One vLLM engine with pdspec's engine plugin, for the equivalence harness and benchmarks.

The drafts policy is switched on the running engine (`auto` / `always`) through the
plugin's policy file, so both modes run on the same engine, interleaved.
Counters come from prometheus-client's multiprocess files: the plugin's counters live
in vLLM's engine-core process, vLLM's spec-decode counters in this one. Every engine of
a process writes into one folder (`process_metrics_dir`); an engine's own files are those
of the processes that appeared while it started, plus this process's.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ITL_SUM = "vllm:inter_token_latency_seconds_sum"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
COUNTERS = (
    "pdspec_proposals_total",
    "pdspec_k0_proposals_total",
    "pdspec_draft_tokens_skipped_total",
    "pdspec_kv_only_passes_total",
    # DFlash on vLLM 0.33's V2 runner: K=0 steps replayed as one CUDA graph, and (test-only
    # PDSPEC_TEST_DFLASH_GRAPH_VERIFY_STEPS) graph steps whose KV matched the eager path's.
    "pdspec_kv_only_graph_replays_total",
    "pdspec_kv_only_graph_verified_total{equal}",
    "pdspec_kv_only_graph_verified_total{differ}",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    # Why a rep may run slow: requests preempted for KV room (their prefill redone), and
    # prefill-worker KV released by lease expiry rather than by a decode worker's read.
    "vllm:num_preemptions_total",
    "vllm:nixl_num_kv_expired_reqs_total",
    # A decode step's time as requests see it (engine_profile --decode-step-from itl).
    ITL_SUM,
    ITL_COUNT,
)


_METRICS_DIR: Path | None = None
_PID_FILE = re.compile(r"_(\d+)\.db$")


def process_metrics_dir() -> Path:
    """The one Prometheus multiprocess folder of every engine this process builds, set in
    the environment once, before the first engine (and prometheus-client) starts. A folder
    per engine, set in the environment before each, lost the second engine's engine-core
    files on the H200 (loadtest/results/kv_only/h200-prefill-worker: its counters read 0),
    while a folder that never changes is the one every child process sees."""
    global _METRICS_DIR
    if _METRICS_DIR is None:
        _METRICS_DIR = Path(tempfile.mkdtemp(prefix="pdspec-engine-metrics-"))
        atexit.register(shutil.rmtree, _METRICS_DIR, True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(_METRICS_DIR)
    return _METRICS_DIR


def metrics_pids(metrics_dir: Path) -> set[int]:
    """The processes that have written metrics files into `metrics_dir` (`counter_<pid>.db`)."""
    return {int(m.group(1)) for p in metrics_dir.iterdir() if (m := _PID_FILE.search(p.name))}


@dataclass
class EngineHandle:
    llm: Any
    policy_file: Path
    metrics_dir: Path
    kv_only_file: Path
    # Requests go in as a P/D prefill worker gets them (do_remote_decode), so the KV
    # connector keeps and then releases their KV as it does for a decode worker's pull.
    kv_transfer_params: dict | None = None
    # The engine's own processes (its engine core): those whose metrics files appeared
    # while it started. This process's files are read for every engine.
    engine_pids: frozenset[int] = frozenset()

    def metrics_files(self, with_this_process: bool = True) -> list[str]:
        """This engine's metrics files: its own processes', and this process's unless told not."""
        own = self.engine_pids | ({os.getpid()} if with_this_process else set())
        return sorted(
            str(p) for p in self.metrics_dir.iterdir() if (m := _PID_FILE.search(p.name)) and int(m.group(1)) in own
        )

    def collect(self):
        """This engine's metric families, merged over its processes' files."""
        from prometheus_client.multiprocess import MultiProcessCollector

        return MultiProcessCollector.merge(self.metrics_files(), accumulate=True)

    def set_kv_only(self, on: bool) -> None:
        from pdspec.worker.engine.control import write_policy

        write_policy(self.kv_only_file, "on" if on else "off")  # read by the drafter at its next K=0 pass

    def set_policy(self, policy: str) -> None:
        from pdspec.worker.engine.control import write_policy

        write_policy(self.policy_file, policy)  # read by the scheduler at its next step

    def gc_pause_seconds(self) -> float | None:
        """Seconds the engine's own processes (not this one) spent in GC so far; None where
        none of them counts GC pauses (the counter is not there: not measured, not zero)."""
        from prometheus_client.multiprocess import MultiProcessCollector

        files = self.metrics_files(with_this_process=False)
        samples = [
            sample.value
            for family in MultiProcessCollector.merge(files, accumulate=True)
            for sample in family.samples
            if sample.name == "pdspec_engine_gc_pause_seconds_total"
        ]
        return sum(samples) if samples else None

    def counters(self) -> dict[str, float]:
        return counter_values(self.collect())


def counter_values(families) -> dict[str, float]:
    """COUNTERS read from metric families: each summed over its labels (vLLM's carry the
    model and engine), except an entry that names label values, `name{value,...}`, which
    reads only the samples with exactly those values."""
    values: dict[str, float] = defaultdict(float)
    for family in families:
        for sample in family.samples:
            if sample.name in COUNTERS:
                values[sample.name] += sample.value
            labelled = sample.name + "{" + ",".join(sample.labels.values()) + "}"
            if sample.labels and labelled in COUNTERS:
                values[labelled] += sample.value
    return {name: values.get(name, 0.0) for name in COUNTERS}


@contextmanager
def plugin_engine(
    models_dir: Path | None = None,
    target: str | None = None,
    drafter: str | None = None,
    method: str = "eagle3",
    k: int = 3,
    max_num_batched_tokens: int = 512,
    max_model_len: int = 4096,
    env: dict[str, str] | None = None,
    kv_transfer_params: dict | None = None,
    **engine_kwargs: Any,
) -> Iterator[EngineHandle]:
    """An offline vLLM engine (`vllm.LLM`) with the pdspec scheduler, set up as a prefill
    worker's engine (K=0 proposals, KV-only drafter pass). `method="none"`: a plain
    engine with no drafter and no plugin (the benchmarks' baseline)."""
    work = Path(tempfile.mkdtemp(prefix="pdspec-engine-"))
    # Must be set before vLLM (and prometheus-client) are imported in this process.
    metrics_dir = process_metrics_dir()
    pids_before = metrics_pids(metrics_dir) - {os.getpid()}
    policy_file = work / "drafts-policy"
    os.environ["PDSPEC_DRAFTS"] = "auto"
    os.environ["PDSPEC_DRAFTS_FILE"] = str(policy_file)
    # pdspec's vLLM plugin sets up a prefill worker's engine (the KV-only drafter pass).
    os.environ["PDSPEC_ROLE"] = "prefill"
    os.environ["PDSPEC_KV_ONLY_DRAFTER_FILE"] = str(work / "kv-only-drafter")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    # CPU build: the engine's compute threads on core 1, this (front-end) process elsewhere,
    # so the two do not take turns on one core and add noise to timings.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.update(env or {})  # a worker's own environment (prefill_worker_engine), read at engine start
    if models_dir is not None:
        target = target or str(models_dir / "target")
        drafter = drafter or str(models_dir / "eagle3")
        engine_kwargs.setdefault("dtype", "float32")  # as pdspec serves the local model
    from vllm import LLM

    if method != "none" and "speculative_config" not in engine_kwargs:
        engine_kwargs["speculative_config"] = {"method": method, "model": drafter, "num_speculative_tokens": k}
        engine_kwargs["scheduler_cls"] = "pdspec.worker.engine.k0_scheduler.K0Scheduler"
    if "model" in engine_kwargs:
        target = engine_kwargs.pop("model")
    llm = LLM(
        model=target,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        disable_log_stats=False,
        # Reps re-run prompts: a prefix-cache hit would make later reps cheaper.
        enable_prefix_caching=False,
        **engine_kwargs,
    )
    engine_pids = frozenset(metrics_pids(metrics_dir) - pids_before - {os.getpid()})
    try:
        yield EngineHandle(llm, policy_file, metrics_dir, work / "kv-only-drafter", kv_transfer_params, engine_pids)
    finally:
        del llm
        shutil.rmtree(work, ignore_errors=True)


# A prefill worker holds a finished request's KV until a decode worker pulls it or its
# lease ends (30 s). With no decode worker here, a lease of 0 frees it at the next step:
# what an instant pull would do.
BENCH_KV_LEASE_S = 0


def worker_engine_options(role: str, model, worker, dummy: bool, kept_env: tuple[str, ...]) -> tuple[dict, dict]:
    """vLLM's engine options of a `role` worker as pdspec's launcher sets them
    (`engine_options`, less the API server's own), random weights with `dummy`, and the
    variables of `kept_env` from the worker's environment (`worker_env`): what an
    in-process engine built as that worker needs."""
    from pdspec.worker.launch import SERVER_OPTIONS, engine_options, is_cpu_build, worker_env

    cpu = is_cpu_build()
    options = {k: v for k, v in engine_options(role, model, worker, cpu).items() if k not in SERVER_OPTIONS}
    if dummy:
        options.update(load_format="dummy", skip_tokenizer_init=True)
    env = worker_env(role, worker, Path(tempfile.gettempdir()), cpu)
    return options, {k: env[k] for k in kept_env if k in env}


def prefill_worker_engine(
    args: argparse.Namespace, mbt: int, max_model_len: int, method: str | None = None, side_channel_port: int = 5600
) -> dict[str, Any]:
    """`plugin_engine` keyword arguments for the engine a prefill worker runs: vLLM's
    options from pdspec's own launcher (`engine_options("prefill", ...)`, NixlConnector
    `kv_producer` included), the worker's environment (NIXL side channel, progress
    delay, KV-only switch), requests that ask for a remote decode, and the KV released
    at once (`BENCH_KV_LEASE_S`). `method="none"`: the same worker with no drafter."""
    from pdspec.settings import ModelSettings, PrefillWorkerSettings
    from proxy.apis.legs import PREFILL_KV_REQUEST

    model = ModelSettings(
        target=args.target,
        drafter=args.drafter,
        method=method or args.method,
        num_speculative_tokens=args.k,
        max_model_len=max_model_len,
        models_dir=args.models_dir,
    )
    worker = PrefillWorkerSettings(
        max_num_batched_tokens=mbt,
        enforce_eager=args.eager,
        gpu_memory_utilization=args.gpu_memory_utilization,
        side_channel_port=side_channel_port,
        # Its own KV-event ports too (a worker publishes them): two engines run in one benchmark.
        kv_events_port=side_channel_port + 50,
    )
    kept = (
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "PDSPEC_NIXL_PROGRESS_DELAY_US",
        "PDSPEC_KV_ONLY_DRAFTER",
        "PDSPEC_DP_IDLE_RANK_VOTE",
        "PDSPEC_ROLE",
        "VLLM_CPU_KVCACHE_SPACE",
    )
    options, env = worker_engine_options("prefill", model, worker, args.dummy, kept)
    options["kv_transfer_config"] = {
        **options["kv_transfer_config"],
        "kv_connector_extra_config": {"kv_lease_duration": BENCH_KV_LEASE_S},
    }
    return {**options, "method": model.method, "env": env, "kv_transfer_params": dict(PREFILL_KV_REQUEST)}


def decode_worker_engine(args: argparse.Namespace, k: int) -> dict[str, Any]:
    """`plugin_engine` keyword arguments for a decode worker's engine with draft length `k`
    (0: no drafter): vLLM's options from pdspec's launcher (`engine_options("decode", ...)`,
    NixlConnector `kv_consumer`) and the worker's environment."""
    from pdspec.settings import DecodeWorkerSettings, ModelSettings

    model = ModelSettings(
        target=args.target,
        drafter=args.drafter,
        method=args.method if k > 0 else "none",
        num_speculative_tokens=max(k, 1),
        max_model_len=args.max_model_len,
        models_dir=args.models_dir,
    )
    worker = DecodeWorkerSettings(
        enforce_eager=args.eager,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=max(args.batch),
        side_channel_port=5620,
        kv_events_port=5680,
    )
    kept = (
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "PDSPEC_NIXL_PROGRESS_DELAY_US",
        "PDSPEC_ROLE",
    )
    options, env = worker_engine_options("decode", model, worker, args.dummy, kept)
    return {**options, "method": model.method, "k": k, "env": env}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine options the benchmark scripts share (`engine_args_from` reads them)."""
    from pdspec.settings import ModelSettings

    parser.add_argument("--models-dir", type=Path, default=ModelSettings().models_dir)
    parser.add_argument("--target", help="target model folder (default: the shipped local model)")
    parser.add_argument("--drafter", help="drafter model folder (default: the shipped local drafter)")
    parser.add_argument("--method", default="eagle3")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, help="per engine")
    parser.add_argument("--dummy", action="store_true", help="random weights, no tokenizer (GPU shapes)")
    parser.add_argument("--eager", action="store_true")


def engine_args_from(args: argparse.Namespace, method: str | None = None) -> tuple[dict[str, Any], int]:
    """`plugin_engine` keyword arguments from `add_engine_arguments`'s options, and the
    target's vocabulary size (for random token-id prompts)."""
    target = args.target or str(args.models_dir / "target")
    drafter = args.drafter or str(args.models_dir / "eagle3")
    vocab = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    engine_args: dict[str, Any] = dict(
        target=target, drafter=drafter, method=method or args.method, k=args.k, enforce_eager=args.eager
    )
    if args.target is None:
        engine_args["dtype"] = "float32"  # as pdspec serves the local model
    if args.dummy:
        engine_args.update(load_format="dummy", skip_tokenizer_init=True)
    if args.gpu_memory_utilization:
        engine_args["gpu_memory_utilization"] = args.gpu_memory_utilization
    return engine_args, vocab
