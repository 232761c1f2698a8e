"""CPU builds: the model runs in vLLM's engine-core process, not in a worker process of its
own (the `in_core_worker` engine feature).

vLLM's CPU platform turns a one-process engine (`distributed_executor_backend` "uni", the
GPU's way for one GPU) into "mp": the engine core spawns a worker process that runs the
model and talks to it over a shared-memory queue. vLLM's reason (platforms/cpu.py): the
worker's OpenMP threads are bound to their cores through environment variables
(`GOMP_CPU_AFFINITY`/`KMP_AFFINITY`, `OMP_NUM_THREADS`, from `VLLM_CPU_OMP_THREADS_BIND`)
that the OpenMP runtime reads once, when it loads, and the "mp" executor sets them for the
process it spawns. Here the API server sets the same variables, with vLLM's own code for
them (`OMPProcessManager.configure_omp_envs`, rank 0), before it spawns the engine core,
which is itself a fresh interpreter: the engine core's OpenMP runtime loads bound, and
every thread it starts afterwards (NIXL's, gloo's, ZMQ's) inherits the worker's cores
(tests/e2e/test_handoff.py checks every thread of the process).

What it saves, per engine: one interpreter that imports torch and vLLM (10-14 s on two
loaded cores, and about 0.5 GB), and the shared-memory queue between the engine core and
its worker, whose readers spin or sleep between steps (engine/short_spin.py bounds that
spin; with the model in the engine core there is no such queue for one-process engines).
Measured with `pdspec up` of the local 1P1D (no engine cache, same greedy text): ready in
55-58 s with vLLM's worker process, 45-50 s without.

Only for an engine of one process: tensor parallel, pipeline parallel or data parallel
engines keep vLLM's "mp" executor (their ranks need processes of their own). GPU builds
are untouched (vLLM already runs a one-GPU engine in its engine core).

Failure policy: off (reported) on GPU builds, with the setting off (`worker.in_core_worker`
false: `PDSPEC_IN_CORE_WORKER=0`), where vLLM's CPU platform has no
`check_and_update_config` or no `vllm.utils.ompmultiprocessing.OMPProcessManager`; then
vLLM's worker process runs the model, as it always did.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import IN_CORE_WORKER_ENV
from pdspec.worker.engine.wrap_once import is_wrapped, wrap_once

log = logging.getLogger("pdspec.engine")

MARKER = "in_core_worker"
# The variables vLLM's "mp" executor sets for a CPU worker it spawns (vllm/utils/ompmultiprocessing.py).
OMP_ENV = (
    "OMP_NUM_THREADS",
    "GOMP_CPU_AFFINITY",
    "KMP_AFFINITY",
    "KMP_BLOCKTIME",
    "KMP_TPAUSE",
    "OMP_PLACES",
    "OMP_PROC_BIND",
)


def one_process_engine(parallel_config: Any) -> bool:
    """Whether an engine of this parallel configuration runs as one rank (no TP, PP or DP)."""
    return parallel_config.world_size == 1 and getattr(parallel_config, "data_parallel_size", 1) == 1


def omp_binding(vllm_config: Any, manager_cls: Any) -> dict[str, str]:
    """The OpenMP variables vLLM's "mp" executor would give rank 0's worker process:
    vLLM's `OMPProcessManager` sets them in os.environ inside a context it restores
    afterwards, so they are read inside it."""
    manager = manager_cls(vllm_config)
    with manager.configure_omp_envs(rank=0, local_rank=0):
        return {name: os.environ[name] for name in OMP_ENV if name in os.environ}


def _in_core(original: Any, manager_cls: Any) -> Any:
    """`check_and_update_config` that undoes the CPU platform's "uni" -> "mp" for a
    one-process engine, with the worker's OpenMP binding set for the engine core."""

    @functools.wraps(original)
    def check_and_update_config(vllm_config: Any) -> None:
        original(vllm_config)
        parallel = vllm_config.parallel_config
        backend = parallel.distributed_executor_backend
        if not one_process_engine(parallel):
            features.report(
                features.IN_CORE_WORKER, False, f"an engine of {parallel.world_size} ranks or data parallel"
            )
        elif backend == "mp":
            binding = omp_binding(vllm_config, manager_cls)
            # Inherited by the engine core this process spawns next (its OpenMP runtime
            # reads them when it loads); this process's own runtime has loaded already.
            os.environ.update(binding)
            parallel.distributed_executor_backend = "uni"
            log.info("pdspec: the model runs in the engine-core process, OpenMP binding %s", binding)
            features.report(features.IN_CORE_WORKER, True)
        elif backend == "uni":  # vLLM runs this engine in one process already (no multiprocessing)
            features.report(features.IN_CORE_WORKER, True)
        else:
            features.report(features.IN_CORE_WORKER, False, f"vLLM's {backend} executor")

    return check_and_update_config


def install_in_core_worker() -> None:
    """Called by pdspec's vLLM plugin in every process of a pdspec server; what it changes
    takes effect in the API server, which builds the engine's configuration (and reports
    the feature's state there)."""
    if os.environ.get(IN_CORE_WORKER_ENV, "1") == "0":
        features.report(features.IN_CORE_WORKER, False, f"off by setting ({IN_CORE_WORKER_ENV}=0)")
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            features.report(features.IN_CORE_WORKER, False, "not a CPU build (vLLM runs a one-GPU engine in its core)")
            return
        from vllm.utils.ompmultiprocessing import OMPProcessManager
    except ImportError:
        features.report(features.IN_CORE_WORKER, False, "vLLM has no OMPProcessManager here")
        return
    platform_cls = type(current_platform)
    wrap_once(
        platform_cls,
        "check_and_update_config",
        MARKER,
        lambda original: _in_core(original, OMPProcessManager),
        static=True,
    )
    if not is_wrapped(getattr(platform_cls, "check_and_update_config", None), MARKER):
        features.report(features.IN_CORE_WORKER, False, "vLLM's CPU platform has no check_and_update_config")
    # Otherwise reported once the engine's configuration is made (the wrapper above).
