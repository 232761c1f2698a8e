"""CPU builds: vLLM's engine-core and worker processes are forked from their parent, not
spawned (the `fork_start` engine feature), so neither imports vLLM again.

vLLM's CPU platform sets `VLLM_WORKER_MULTIPROC_METHOD=spawn` in its
`check_and_update_config`, for every CPU server: the API server spawns the engine core, and
the engine core spawns its worker, each a fresh interpreter that imports torch and vLLM again
(10-14 s each on a loaded two-core machine). Forked, they start from their parent's imports.
Measured here (`pdspec up` of the local 1P1D, engine cache warm, two runs each): ready in
33.2 and 32.9 s spawned, 18.9 and 19.8 s forked, the same greedy text.

Why fork is safe here: what breaks a forked child is an initialized device runtime (CUDA:
this feature is off on GPU builds) or an OpenMP pool that already ran a parallel region
(vLLM's multiproc executor says as much of libgomp); neither parent has run one when it
creates its child: the API server only tokenizes, and the engine core creates its worker
before any model step. The worker binds its OpenMP threads to its cores after the fork, as
it does after a spawn.

Failure policy: off (reported) on GPU builds, with the setting off (`worker.fork_start`
false: `PDSPEC_FORK_START=0`), or where vLLM's CPU platform has no
`check_and_update_config`; then vLLM spawns, as it always did.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import FORK_START_ENV
from pdspec.worker.engine.wrap_once import is_wrapped, wrap_once

MARKER = "fork_start"
START_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"


def _forking(original: Any) -> Any:
    """`check_and_update_config` that leaves vLLM's start method at fork (the platform's own
    sets spawn; every other setting it makes stays)."""

    @functools.wraps(original)
    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        original(vllm_config)
        os.environ[START_METHOD_ENV] = "fork"

    return check_and_update_config


def install_fork_start() -> None:
    """Called by pdspec's vLLM plugin in every process of every pdspec server (the API
    server creates the engine core, the engine core its worker)."""
    if os.environ.get(FORK_START_ENV, "1") == "0":
        features.report(features.FORK_START, False, f"off by setting ({FORK_START_ENV}=0)")
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            features.report(features.FORK_START, False, "not a CPU build (CUDA needs spawned processes)")
            return
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:
        features.report(features.FORK_START, False, "vLLM has no CPU platform here")
        return
    wrap_once(CpuPlatform, "check_and_update_config", MARKER, _forking, class_method=True)
    if not is_wrapped(getattr(CpuPlatform, "check_and_update_config", None), MARKER):
        features.report(features.FORK_START, False, "vLLM's CPU platform has no check_and_update_config")
        return
    features.report(features.FORK_START, True)
