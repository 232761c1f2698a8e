"""vLLM general plugin: runs in every process vLLM starts (API server, engine core,
workers), so start-up fixes that must hold in the engine-core process live here.

It does nothing unless pdspec's worker launcher set the environment it reads, so a
plain `vllm serve` in the same environment is unaffected.
"""

from __future__ import annotations

import logging
import os

from pdspec.worker.engine.control import ROLE_ENV
from pdspec.worker.nixl_progress import PROGRESS_DELAY_ENV, apply_progress_delay

log = logging.getLogger("pdspec.worker.plugin")


def register() -> None:
    """Installs, in this vLLM process, what the worker's role uses (the one place that maps
    a role to its engine hooks, as its role package lists them): every P/D worker gets the
    NIXL progress delay, the CPU KV-core pinning and the short spin of vLLM's queue readers;
    a prefill worker also the KV-only drafter pass, the DP idle-rank vote, the wait while
    only held KV remains and, in tests, the drafter-KV switch; a decode worker,
    in tests, the dump of the drafter KV it received. Every worker process counts its GC
    pauses (`pdspec_engine_gc_pause_seconds_total`). The K=0 rule comes in through
    `--scheduler-cls`."""
    delay = os.environ.get(PROGRESS_DELAY_ENV)
    if delay is not None:
        applied = apply_progress_delay(int(delay))
    role = os.environ.get(ROLE_ENV)
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
    """The role's engine hooks (its role package lists them), in a fixed order."""
    from pdspec.worker.engine.cpu_affinity import install_cpu_affinity_fix
    from pdspec.worker.engine.dp_vote import install_dp_vote
    from pdspec.worker.engine.kv_hold_wait import install_kv_hold_wait
    from pdspec.worker.engine.kv_only import install_kv_only_drafter
    from pdspec.worker.engine.short_spin import install_short_spin
    from pdspec.worker.engine.testing_hooks import install_test_hooks

    installers = {"cpu_affinity": install_cpu_affinity_fix, "kv_only": install_kv_only_drafter,
                  "dp_vote": install_dp_vote, "kv_hold_wait": install_kv_hold_wait, "short_spin": install_short_spin,
                  "testing_hooks": install_test_hooks}  # fmt: skip
    unknown = set(hooks) - set(installers)
    if unknown:
        raise ValueError(f"unknown engine hooks {sorted(unknown)}")
    for name, install in installers.items():
        if name in hooks:
            install()
