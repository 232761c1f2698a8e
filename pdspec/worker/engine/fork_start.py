"""CPU builds: vLLM's engine-core process is forked from its API server, not spawned (the
`fork_start` engine feature), so it does not import vLLM again.

vLLM's CPU platform sets `VLLM_WORKER_MULTIPROC_METHOD=spawn` for every CPU server: the API
server spawns the engine core, and the engine core spawns its model worker, each a fresh
interpreter that imports torch and vLLM again (10-14 s each on a loaded two-core machine).
The worker must stay spawned: its OpenMP threads are bound to the worker's cores through
environment variables (`GOMP_CPU_AFFINITY`, `OMP_NUM_THREADS`) that the OpenMP runtime reads
once, when it loads; a forked worker inherits its parent's runtime, unbound, with a thread
per core (tried: tests/e2e/test_handoff.py's core check found the prefill worker's threads on
both cores). The engine core runs no model step, so it is forked: only the module that
creates it, `vllm.v1.engine.utils`, is given the fork context (its tensor-IPC queue, for
multimodal shared-memory tensors, too); the engine core's own executor and vLLM's
data-parallel coordinator still spawn. Measured here (`pdspec up` of the local 1P1D, engine cache
warm, two runs each, same greedy text): ready in 30.6 and 30.6 s spawned, 22.3 and 25.0 s
with the engine core forked (forking the worker too: 19-20 s, with its threads unbound).

Why forking the engine core is safe: what breaks a forked child is an initialized device
runtime (CUDA: this feature is off on GPU builds), an OpenMP pool that already ran a
parallel region (the API server runs none before it creates its engine core), or a lock
that another thread held at the fork. pdspec's one thread in the API server that takes
locks, the GC-pause flusher (metrics.py), holds the fork back while it flushes. vLLM's
plugins are not loaded again in a forked engine core (vLLM's loaded-flag is inherited): it
runs with the hooks the API server installed. vLLM's own reasons to spawn are kept: with
`--numa-bind` (numactl wraps a spawned interpreter) the original context is used.

Failure policy: off (reported) on GPU builds, with the setting off (`worker.fork_start`
false: `PDSPEC_FORK_START=0`), or where vLLM has no `vllm.v1.engine.utils.get_mp_context`;
then vLLM spawns, as it always did.
"""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
import sys
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import FORK_START_ENV
from pdspec.worker.engine.wrap_once import is_wrapped, wrap_once

MARKER = "fork_start"
ENGINE_UTILS = "vllm.v1.engine.utils"  # where vLLM creates the engine-core process


def _forking(original: Any) -> Any:
    """`get_mp_context` that gives the fork context (vLLM's gives spawn on CPU builds)."""

    @functools.wraps(original)
    def get_mp_context() -> Any:
        if "--numa-bind" in sys.argv:  # vLLM's binding wraps a spawned interpreter
            return original()
        return multiprocessing.get_context("fork")

    return get_mp_context


def install_fork_start() -> None:
    """Called by pdspec's vLLM plugin in the processes of every pdspec server where vLLM
    loads plugins (the API server, which creates the engine core, and the spawned worker)."""
    if os.environ.get(FORK_START_ENV, "1") == "0":
        features.report(features.FORK_START, False, f"off by setting ({FORK_START_ENV}=0)")
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            features.report(features.FORK_START, False, "not a CPU build (CUDA needs spawned processes)")
            return
        engine_utils = importlib.import_module(ENGINE_UTILS)
    except ImportError:
        features.report(features.FORK_START, False, f"vLLM has no {ENGINE_UTILS} here")
        return
    wrap_once(engine_utils, "get_mp_context", MARKER, _forking)
    if not is_wrapped(getattr(engine_utils, "get_mp_context", None), MARKER):
        features.report(features.FORK_START, False, f"vLLM's {ENGINE_UTILS} has no get_mp_context")
        return
    features.report(features.FORK_START, True)
