"""CPU builds: NixlConnector's "KV core" stays among the worker's own cores, and the thread
that builds the connector gets its cores back (the `kv_core_pinning` engine feature)."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import ROLE_ENV
from pdspec.worker.engine.wrap_once import is_wrapped, wrap_once

log = logging.getLogger("pdspec.engine")

# The wrapper that limits vLLM's NUMA view (and so the KV core) to this process's cores.
KV_CORE_MARKER = "cpu_affinity_kv_core"


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
    return wrap_once(platform_cls, "discover_numa_topology", KV_CORE_MARKER, _within_own_cores, static=True)


def _within_own_cores(original: Any) -> Any:
    def discover_numa_topology() -> list[list[int]]:
        return cores_within(original(), os.sched_getaffinity(0))

    return discover_numa_topology


def install_affinity_restore(worker_cls: type) -> bool:
    """Give the thread that builds NixlConnector's worker its own cores back afterwards.

    vLLM pins that thread (the worker's main thread, the OpenMP master that runs the
    model) to the KV core; only the NIXL threads started during construction need to be
    there. With a multi-core binding ("0-3") the KV core is one of the worker's OpenMP
    cores, so leaving the main thread there would put two compute threads on one core.
    Idempotent; returns whether it installed the wrapper."""
    return wrap_once(worker_cls, "__init__", "cpu_affinity_restore", _restoring_affinity)


def _restoring_affinity(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cores = os.sched_getaffinity(0)
        try:
            original(self, *args, **kwargs)
        finally:
            if os.sched_getaffinity(0) != cores:
                os.sched_setaffinity(0, cores)

    return __init__


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
    wrapped = is_wrapped(type(current_platform).discover_numa_topology, KV_CORE_MARKER)
    features.report(features.KV_CORE_PINNING, wrapped, "" if wrapped else "vLLM's CPU platform has no NUMA discovery")
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
    except ImportError:
        return  # another layout of the connector: the topology wrapper above still applies
    install_affinity_restore(NixlBaseConnectorWorker)
