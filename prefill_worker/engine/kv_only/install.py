"""Installs the KV-only drafter pass on whichever runners this vLLM has (the prefill role's
`kv_only` hook, prefill_worker/role.py): EAGLE3's (eagle3.py) on the V1 proposer and the V2
speculator, DFlash's (dflash.py) on the V1 proposer, and on V2 the DFlash count and context
graphs. Feature-detected: a vLLM version pdspec does not know gets nothing (reported)."""

from __future__ import annotations

from pdspec.worker.engine import features
from pdspec.worker.engine.capabilities import SUPPORTED_VLLM
from prefill_worker.engine.kv_only.dflash import (
    install_dflash_v2,
    install_kv_only_dflash_v1,
    install_profile_capture_mark,
)
from prefill_worker.engine.kv_only.eagle3 import (
    build_eagle3_pass,
    install_kv_only_v1,
    install_kv_only_v2,
    v1_blocker,
    v2_blocker,
)
from prefill_worker.engine.kv_only.proposer_pass import decide_at_load, kv_only_flag, kv_only_pass


def install_kv_only_drafter() -> None:
    """Install the KV-only pass on whichever runners this vLLM has (feature-detected; a
    vLLM version the plugin does not know gets nothing). Off with PDSPEC_KV_ONLY_DRAFTER=0
    (`--prefill.kv_only_drafter false`)."""
    try:
        import vllm
    except ImportError:
        return
    if not vllm.__version__.startswith(SUPPORTED_VLLM):
        features.report(features.KV_ONLY_PASS, False, f"vLLM {vllm.__version__} is not one pdspec knows")
        return
    if not kv_only_flag().current() and kv_only_flag().file.path is None:
        features.report(features.KV_ONLY_PASS, False, "turned off by its setting (kv_only_drafter false)")
        return  # off for good: leave vLLM's classes untouched
    try:
        from vllm.v1.spec_decode.eagle import EagleProposer
    except ImportError:
        EagleProposer = None  # noqa: N806
    if EagleProposer is not None and hasattr(EagleProposer, "set_inputs_first_pass"):
        EagleProposer._pdspec_kv_only_pass = kv_only_pass
        install_kv_only_v1(EagleProposer)
        decide_at_load(EagleProposer, v1_blocker, build_eagle3_pass)
    _install_dflash()
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
    except ImportError:
        return  # no V2 runner (the CPU build)
    EagleSpeculator._pdspec_kv_only_pass = kv_only_pass
    install_kv_only_v2(EagleSpeculator)
    decide_at_load(EagleSpeculator, v2_blocker, build_eagle3_pass)


def _install_dflash() -> None:
    """DFlash drafters (dflash.py): the pass on the V1 proposer; on V2 the count and the
    context step's CUDA graphs."""
    try:
        from vllm.v1.spec_decode.dflash import DFlashProposer
    except ImportError:
        DFlashProposer = None  # noqa: N806
    if DFlashProposer is not None and hasattr(DFlashProposer, "set_inputs_first_pass"):
        DFlashProposer._pdspec_kv_only_pass = kv_only_pass
        install_kv_only_dflash_v1(DFlashProposer)
    try:
        from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    except ImportError:
        return
    install_dflash_v2(DFlashSpeculator)
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    except ImportError:
        return
    install_profile_capture_mark(GPUModelRunner)
