"""CPU builds: the model runs in vLLM's engine-core process, not in a worker process of its
own (the `in_core_worker` engine feature).

vLLM's CPU platform turns a one-process engine (`distributed_executor_backend` "uni", the
GPU's way for one GPU) into "mp": the engine core spawns a worker process that runs the
model and talks to it over a shared-memory queue. vLLM's reason (platforms/cpu.py): the
worker's OpenMP threads are bound to their cores through environment variables
(`GOMP_CPU_AFFINITY`/`KMP_AFFINITY`, `OMP_NUM_THREADS`, from `VLLM_CPU_OMP_THREADS_BIND`)
that the OpenMP runtime reads once, when it loads, and the "mp" executor sets them, with
`OMPProcessManager.configure_omp_envs`, around the start of the process it spawns. Here the
API server does the same, with the same vLLM code (rank 0), around the start of its engine
core only (`CoreEngineProcManager.__init__`; its own environment is left as it was). The
engine core is itself a fresh interpreter: its OpenMP runtime loads bound, and every thread
it starts afterwards (NIXL's, gloo's, ZMQ's, vLLM's input and output threads) runs on the
worker's cores (tests/e2e/test_handoff.py checks every thread of the process). With a
binding of several cores those threads share the OpenMP master's core (measured only with
one core a worker, `make run`'s binding).

What it saves, per engine: one interpreter that imports torch and vLLM (10-14 s on two
loaded cores, and about 0.5 GB), and the shared-memory queue between the engine core and
its worker, whose readers spin or sleep between steps: `short_spin` then has nothing to
act on, and says so (off, with the reason) in the API server and the engine core.
Measured on the local 1P1D (`pdspec bench --workload cpu-in-core`, eight stacks ABBAABBA,
loadtest/results/in_core_worker/cpu-1p1d/): ready in 24.4 s [23.0-25.0] against 32.6 s
[31.0-34.1] with vLLM's worker process, inter-token latency 0.80-0.91 of it in every round;
TTFT the same at concurrency 1 and, over 40 requests a stack at concurrency 4
(loadtest/results/in_core_worker/cpu-1p1d-c4/), median 0.82-1.03 of it by round.

Only where vLLM chose "uni" and its CPU platform made it "mp": tensor, pipeline or data
parallel engines and an explicit `--distributed-executor-backend mp` keep vLLM's worker
processes. GPU builds are untouched (vLLM already runs a one-GPU engine in its engine core).
The backend is set back in every process that makes the configuration (vLLM makes it again
in the engine core for the drafter); the binding is made, and the state reported, only in
the process that starts the engine (the API server, the one without a multiprocessing
parent).

Failure policy: off (reported) on GPU builds, with the setting off (`worker.in_core_worker`
false: `PDSPEC_IN_CORE_WORKER=0`), where vLLM's CPU platform has no
`check_and_update_config`, or vLLM has no `OMPProcessManager` or `CoreEngineProcManager` to
bind the engine core with; then vLLM's worker process runs the model, as it always did.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import multiprocessing
import os
from collections.abc import Iterator
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import IN_CORE_WORKER_ENV, MODEL_IN_CORE_ENV, ROLE_ENV
from pdspec.worker.engine.wrap_once import wrap_once

log = logging.getLogger("pdspec.engine")

MARKER = "in_core_worker"
ENGINE_UTILS = "vllm.v1.engine.utils"  # where vLLM starts the engine-core process
# short_spin's state where the model runs in the engine core (no shared-memory queue).
NO_QUEUE = "the model runs in the engine-core process (in_core_worker): no shared-memory queue to read"

# The OpenMP binding for the next engine core this process starts (set when the engine's
# configuration is made, used around the engine core's start).
_binding: dict[str, str] | None = None


def starts_engines() -> bool:
    """Whether this process is the one that starts the engine (not a spawned engine core
    or worker, which have a multiprocessing parent)."""
    return multiprocessing.parent_process() is None


def omp_binding(vllm_config: Any, manager_cls: Any) -> dict[str, str]:
    """The variables vLLM's "mp" executor sets around the start of rank 0's worker
    process: vLLM's `OMPProcessManager` sets them in os.environ inside a context that
    restores them, so they are read inside it. Empty where vLLM binds nothing
    (`VLLM_CPU_OMP_THREADS_BIND=nobind`)."""
    manager = manager_cls(vllm_config)
    before = dict(os.environ)
    with manager.configure_omp_envs(rank=0, local_rank=0):
        return {name: value for name, value in os.environ.items() if before.get(name) != value}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` set in os.environ inside, the earlier state restored after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def off_reason(asked: str | None, parallel: Any) -> str:
    """Why an engine keeps the backend it has (vLLM's choice before the CPU platform's was
    `asked`)."""
    if parallel.world_size > 1:
        return f"an engine of {parallel.world_size} ranks (tensor or pipeline parallel)"
    if getattr(parallel, "data_parallel_size", 1) > 1:
        return "data parallel"
    if asked == "uni":
        return "vLLM's multiprocessing is off (VLLM_ENABLE_V1_MULTIPROCESSING=0): the model runs in the front end"
    return f"vLLM's {asked} executor asked for"


def _in_core(original: Any, manager_cls: Any) -> Any:
    """`check_and_update_config` that undoes the CPU platform's "uni" -> "mp" for a
    one-process engine; in the process that starts the engine, with the worker's OpenMP
    binding kept for the engine core's start."""

    @functools.wraps(original)
    def check_and_update_config(vllm_config: Any) -> None:
        global _binding
        parallel = vllm_config.parallel_config
        asked = parallel.distributed_executor_backend
        original(vllm_config)
        one_process = parallel.world_size == 1 and getattr(parallel, "data_parallel_size", 1) == 1
        switch = asked == "uni" and parallel.distributed_executor_backend == "mp" and one_process
        if switch:
            parallel.distributed_executor_backend = "uni"
        if not starts_engines():
            return  # the engine core's copies of the configuration (its drafter's)
        if not switch:
            features.report(features.IN_CORE_WORKER, False, off_reason(asked, parallel))
            return
        _binding = {**omp_binding(vllm_config, manager_cls), MODEL_IN_CORE_ENV: "1"}
        log.info("pdspec: the model runs in the engine-core process, started with %s", _binding)
        features.report(features.IN_CORE_WORKER, True)
        if os.environ.get(ROLE_ENV) in ("prefill", "decode"):  # the roles that have short_spin
            features.report(features.SHORT_SPIN, False, NO_QUEUE)

    return check_and_update_config


def _bound_start(original: Any) -> Any:
    """`CoreEngineProcManager.__init__` (it starts the engine-core processes) with the
    binding of the configuration made last set around it, then cleared."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        global _binding
        binding, _binding = _binding or {}, None
        with environment(binding):
            original(self, *args, **kwargs)

    return __init__


def install_in_core_worker() -> None:
    """Called by pdspec's vLLM plugin in every process of a pdspec server (the API server,
    which makes the engine's configuration and starts its engine core, and the engine core,
    which makes its drafter's)."""
    if os.environ.get(IN_CORE_WORKER_ENV, "1") == "0":
        features.report(features.IN_CORE_WORKER, False, f"off by setting ({IN_CORE_WORKER_ENV}=0)")
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            features.report(features.IN_CORE_WORKER, False, "not a CPU build (vLLM runs a one-GPU engine in its core)")
            return
        from vllm.utils.ompmultiprocessing import OMPProcessManager

        engine_utils = importlib.import_module(ENGINE_UTILS)
    except ImportError:
        features.report(features.IN_CORE_WORKER, False, "vLLM has no OMPProcessManager or v1 engine utils here")
        return
    manager_cls = getattr(engine_utils, "CoreEngineProcManager", None)
    platform_cls = type(current_platform)
    if manager_cls is None or getattr(platform_cls, "check_and_update_config", None) is None:
        features.report(
            features.IN_CORE_WORKER, False, "vLLM has no CoreEngineProcManager or CPU check_and_update_config"
        )
        return
    # The start first: a configuration switched without its bound start would run unbound.
    wrap_once(manager_cls, "__init__", MARKER, _bound_start)
    wrap_once(
        platform_cls,
        "check_and_update_config",
        MARKER,
        lambda original: _in_core(original, OMPProcessManager),
        static=True,
    )
    # Reported once the engine's configuration is made (the wrapper above).
