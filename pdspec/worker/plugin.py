"""vLLM general plugin: runs in every process vLLM starts (API server, engine core,
workers), so start-up fixes that must hold in the engine-core process live here.

It does nothing unless pdspec's worker launcher set the environment it reads, so a
plain `vllm serve` in the same environment is unaffected.
"""

from __future__ import annotations

import logging
import os

from pdspec.worker.nixl_progress import PROGRESS_DELAY_ENV, apply_progress_delay

log = logging.getLogger("pdspec.worker.plugin")


def register() -> None:
    delay = os.environ.get(PROGRESS_DELAY_ENV)
    if delay is not None:
        applied = apply_progress_delay(int(delay))
    if os.environ.get("PDSPEC_ROLE") in ("prefill", "decode"):
        from pdspec.worker.engine import features

        if delay is None:
            features.report(features.NIXL_PROGRESS_DELAY, False, f"no delay set ({PROGRESS_DELAY_ENV})")
        elif not applied:
            features.report(features.NIXL_PROGRESS_DELAY, False, "nixl is not installed")
        else:
            features.report(features.NIXL_PROGRESS_DELAY, True)
    from pdspec.worker.engine_plugin import install_cpu_affinity_fix

    install_cpu_affinity_fix()
    if os.environ.get("PDSPEC_ROLE") == "prefill":
        from pdspec.worker.engine_plugin import install_for_process, install_test_hooks

        install_for_process()
        install_test_hooks()
