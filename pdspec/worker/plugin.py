"""vLLM general plugin: runs in every process vLLM starts (API server, engine core,
workers), so start-up fixes that must hold in the engine-core process live here.

It does nothing unless pdspec's worker launcher set the environment it reads, so a
plain `vllm serve` in the same environment is unaffected. It is the one place that maps a
role to its engine hooks: the role package's role.py names them (`HOOKS`), and they are
imported from there, the role's own from its package (prefill_worker/engine/, ...), the
shared ones from pdspec/worker/engine/.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable

from pdspec.worker.engine.control import ROLE_ENV
from pdspec.worker.nixl_progress import PROGRESS_DELAY_ENV, apply_progress_delay

log = logging.getLogger("pdspec.worker.plugin")

# The roles pdspec's launcher starts (pdspec/worker/launch.py's Role).
PDSPEC_ROLES = ("prefill", "decode", "colocated")


def register() -> None:
    """Installs, in this vLLM process, what the worker's role uses: the hooks its role.py
    names (`HOOKS`), in its order. Every P/D worker gets the NIXL progress delay, the CPU
    KV-core pinning and the short spin of vLLM's queue readers; a prefill worker also the
    KV-only drafter pass, the DP idle-rank vote, the wait while only held KV remains and, in
    tests, the drafter-KV switch; a decode worker, in tests, the dump of the drafter KV it
    received. Every worker process counts its GC pauses (`pdspec_engine_gc_pause_seconds_total`).
    Every pdspec server, the colocated one included, gets the CPU build's fix of the
    rejection sampler's expand kernel (engine/cpu_expand_fix.py) and, on CPU builds, its
    model run in the engine-core process (engine/in_core_worker.py). The K=0 rule (and the
    decode worker's stale-KV guard) comes in through `--scheduler-cls`."""
    delay = os.environ.get(PROGRESS_DELAY_ENV)
    if delay is not None:
        applied = apply_progress_delay(int(delay))
    role = os.environ.get(ROLE_ENV)
    if role in PDSPEC_ROLES:
        # A fix of vLLM's own sampling, so the colocated reference server gets it too
        # (P/D must match it).
        from pdspec.worker.engine.cpu_expand_fix import install_cpu_expand_fix
        from pdspec.worker.engine.in_core_worker import install_in_core_worker

        install_cpu_expand_fix()
        # Every pdspec server's engine runs its model in the engine core (the colocated one too).
        install_in_core_worker()
    if role not in ("prefill", "decode"):
        return
    from pdspec.worker.engine import features
    from pdspec.worker.engine.metrics import install_gc_pause_counter
    from pdspec.worker.roles import ROLES

    install_gc_pause_counter()

    if delay is None:
        features.report(features.NIXL_PROGRESS_DELAY, False, f"no delay set ({PROGRESS_DELAY_ENV})")
    elif not applied:
        features.report(features.NIXL_PROGRESS_DELAY, False, "nixl is not installed")
    else:
        features.report(features.NIXL_PROGRESS_DELAY, True)
    install_role_hooks(ROLES[role].hooks)


def install_role_hooks(hooks: tuple[str, ...]) -> None:
    """Runs each hook, `module:function` as a role.py names it, in the given order; every
    one is looked up before any runs, so a name that does not resolve (ValueError) installs
    nothing. The hooks are imported only here, in vLLM's processes: a role package's hooks
    live in that package, and the shared engine code never imports a role package."""
    installers = [_resolve(hook) for hook in hooks]
    unknown = [hook for hook, install in zip(hooks, installers) if install is None]
    if unknown:
        raise ValueError(f"unknown engine hooks {unknown}")
    for install in installers:
        install()


def _resolve(hook: str) -> Callable[[], None] | None:
    """The function a hook names; None where there is no such module or function (an
    import that fails inside an existing module raises as it is)."""
    module_name, _, function = hook.partition(":")
    if not module_name or not function:
        return None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            return None
        raise
    install = getattr(module, function, None)
    return install if callable(install) else None
