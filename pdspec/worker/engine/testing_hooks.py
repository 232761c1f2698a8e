"""Test-only: a prefill worker that does not write the drafter's KV (the negative control of
the drafter-KV tests). Installed only when the test-only environment variable names a file."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

from pdspec.worker.engine.control import TEST_SKIP_DRAFTER_FILE_ENV
from pdspec.worker.engine.wrap_once import wrap_once

log = logging.getLogger("pdspec.engine")

def install_skip_drafter_prefill(runner_cls: type, switch_file: Path) -> None:
    """Negative control for the drafter-KV tests: while `switch_file` exists, the model
    runner does not run the drafter at all, and the drafter's KV blocks were zeroed when
    the switch turned on, so the decode worker pulls zeros instead of drafter KV (not a
    stale copy of an earlier request's). Installed only when the test-only environment
    variable names a file."""
    wrap_once(runner_cls, "propose_draft_token_ids", "skip_drafter_prefill",
              lambda original: _skipping_drafter(original, switch_file))  # fmt: skip


def _skipping_drafter(original: Any, switch_file: Path) -> Any:
    @functools.wraps(original)
    def propose_draft_token_ids(self, *args, **kwargs):
        if not switch_file.exists():
            self._pdspec_drafter_kv_zeroed = False
            return original(self, *args, **kwargs)
        import torch

        if not getattr(self, "_pdspec_drafter_kv_zeroed", False):
            zeroed = _zero_drafter_kv(self)
            log.warning("pdspec test hook: drafter KV zeroed (%d tensors); drafter off", zeroed)
            self._pdspec_drafter_kv_zeroed = True
        return torch.empty(len(self.input_batch.req_ids), 0, dtype=torch.int64, device=self.device)

    return propose_draft_token_ids


def _zero_drafter_kv(runner: Any) -> int:
    names = getattr(getattr(runner, "drafter", None), "_draft_attn_layer_names", None) or ()
    context = runner.vllm_config.compilation_config.static_forward_context
    count = 0
    for name in names:
        cache = getattr(context.get(name), "kv_cache", None)
        for tensor in cache if isinstance(cache, (list, tuple)) else [cache]:
            if tensor is not None and hasattr(tensor, "zero_") and tensor.numel():
                tensor.zero_()
                count += 1
    return count


def install_test_hooks() -> None:
    switch = os.environ.get(TEST_SKIP_DRAFTER_FILE_ENV)
    if not switch:
        return
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return
    install_skip_drafter_prefill(GPUModelRunner, Path(switch))
