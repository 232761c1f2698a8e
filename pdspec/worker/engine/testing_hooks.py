"""Test-only engine hooks, each installed only when its test-only environment variable is set
(`test_hooks` in the worker settings):

- a prefill worker that does not write the drafter's KV (the negative control of the
  drafter-KV tests);
- a decode worker that saves the drafter KV it received over NIXL, before its own drafter
  writes anything, so a test can compare it with what a full drafter pass writes
  (tests/e2e/test_nixl_drafter_kv.py);
- a worker of either role that runs no step while a switch file exists, so a test holds a
  leg mid-step for as long as it needs (tests/e2e/test_kv_push.py)."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from pdspec.worker.engine.control import (
    TEST_DUMP_DRAFTER_KV_DIR_ENV,
    TEST_PAUSE_STEPS_FILE_ENV,
    TEST_SKIP_DRAFTER_FILE_ENV,
)
from pdspec.worker.engine.wrap_once import wrap_once

log = logging.getLogger("pdspec.engine")


def install_skip_drafter_prefill(runner_cls: type, switch_file: Path) -> None:
    """Negative control for the drafter-KV tests: while `switch_file` exists, the model
    runner does not run the drafter at all, and the drafter's KV blocks were zeroed when
    the switch turned on, so the decode worker pulls zeros instead of drafter KV (not a
    stale copy of an earlier request's). Installed only when the test-only environment
    variable names a file."""
    wrap_once(
        runner_cls,
        "propose_draft_token_ids",
        "skip_drafter_prefill",
        lambda original: _skipping_drafter(original, switch_file),
    )


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


def prompt_key(prompt_token_ids: list[int]) -> str:
    """The file name stem a prompt's drafter-KV dump is saved under."""
    return hashlib.sha256(",".join(map(str, prompt_token_ids)).encode()).hexdigest()[:16]


def install_dump_received_drafter_kv(runner_cls: type, dump_dir: Path) -> None:
    """While `dump_dir` exists, every request that enters the model runner with tokens
    already computed (on a decode worker without prefix caching: the KV pulled over NIXL)
    has its drafter layers' KV blocks saved, at the start of its first step, before this
    worker's target or drafter runs. Only the blocks the received tokens fill completely:
    the block holding the last prompt token (which the decode worker recomputes) and any
    later one are left out. Saved to `<dump_dir>/<prompt_key>.pt` (the latest request of a
    prompt wins) as {"prompt_token_ids", "num_computed_tokens", "block_size", "layers":
    {layer name: tensor [blocks, ...]}}."""
    wrap_once(runner_cls, "execute_model", "dump_received_drafter_kv", lambda original: _dumping(original, dump_dir))


def _dumping(original: Any, dump_dir: Path) -> Any:
    @functools.wraps(original)
    def execute_model(self, scheduler_output, *args, **kwargs):
        if dump_dir.is_dir():
            try:
                _dump_received_drafter_kv(self, scheduler_output, dump_dir)
            except Exception:  # a test hook must not take the worker down; the test sees no dump
                log.exception("pdspec test hook: drafter KV dump failed")
        return original(self, scheduler_output, *args, **kwargs)

    return execute_model


def _dump_received_drafter_kv(runner: Any, scheduler_output: Any, dump_dir: Path) -> None:
    import torch

    names = sorted(getattr(getattr(runner, "drafter", None), "_draft_attn_layer_names", None) or ())
    context = runner.vllm_config.compilation_config.static_forward_context
    groups = runner.kv_cache_config.kv_cache_groups
    for new in scheduler_output.scheduled_new_reqs:
        if not new.num_computed_tokens or new.prompt_token_ids is None:
            continue  # computed here from the start: nothing was received
        layers, block_size = {}, None
        for name in names:
            group = next(i for i, g in enumerate(groups) if name in g.layer_names)
            block_size = groups[group].kv_cache_spec.block_size
            full = new.num_computed_tokens // block_size
            cache = context[name].kv_cache
            cache = cache[0] if isinstance(cache, (list, tuple)) else cache  # per virtual engine
            if cache.shape[0] != runner.kv_cache_config.num_blocks:
                raise RuntimeError(f"{name}: KV cache {tuple(cache.shape)} is not indexed by block first")
            layers[name] = cache.index_select(0, torch.tensor(new.block_ids[group][:full], dtype=torch.long))
        if not layers:
            continue  # no drafter
        dump = {
            "prompt_token_ids": list(new.prompt_token_ids),
            "num_computed_tokens": new.num_computed_tokens,
            "block_size": block_size,
            "layers": layers,
        }
        path = dump_dir / f"{prompt_key(new.prompt_token_ids)}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save(dump, tmp)
        os.replace(tmp, path)  # a reader never sees half a file


PAUSE_POLL_S = 0.01  # how soon a paused step goes on once its switch file is gone


def install_pause_steps(runner_cls: type, pause_file: Path) -> None:
    """While `pause_file` exists, `execute_model` waits before it runs: the engine's
    scheduled requests stay mid-step (their prefill not done, their KV not written) and
    nothing else is scheduled, whatever the machine's speed. A test that creates the file
    removes it; a step goes on within `PAUSE_POLL_S` of that."""
    wrap_once(runner_cls, "execute_model", "pause_steps", lambda original: _pausing(original, pause_file))


def _pausing(original: Any, pause_file: Path) -> Any:
    @functools.wraps(original)
    def execute_model(self, *args, **kwargs):
        if pause_file.exists():
            log.warning("pdspec test hook: steps paused while %s exists", pause_file)
            while pause_file.exists():
                time.sleep(PAUSE_POLL_S)
        return original(self, *args, **kwargs)

    return execute_model


def install_test_hooks() -> None:
    """The hooks whose environment variable the launcher set (`test_hooks`)."""
    switch = os.environ.get(TEST_SKIP_DRAFTER_FILE_ENV)
    dump_dir = os.environ.get(TEST_DUMP_DRAFTER_KV_DIR_ENV)
    pause_file = os.environ.get(TEST_PAUSE_STEPS_FILE_ENV)
    if not switch and not dump_dir and not pause_file:
        return
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return
    if switch:
        install_skip_drafter_prefill(GPUModelRunner, Path(switch))
    if dump_dir:
        install_dump_received_drafter_kv(GPUModelRunner, Path(dump_dir))
    if pause_file:
        install_pause_steps(GPUModelRunner, Path(pause_file))
