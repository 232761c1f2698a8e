"""What every KV-only drafter pass shares, whatever the drafter (eagle3.py, dflash.py): the
live switch, the decision once per proposer (reported as the `kv_only_pass` engine feature,
with the reason when off), giving the pass up for the process when it fails at run time
(logged; the step reruns on vLLM's path, which rewrites every slot the pass touched), the
V1 proposer's K=0 wrapper and its inputs, and the method that runs a pass and counts it
(`pdspec_kv_only_passes_total`). Imports no drafter module, so the drafter modules import
this one and never each other."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.control import KV_ONLY_FILE_ENV, LiveFlag
from pdspec.worker.engine.wrap_once import wrap_once

log = logging.getLogger("pdspec.engine")


class KvOnlyUnsupported(Exception):
    """Raised by a pass builder: the drafter is one the pass does not cover (the reason)."""


def kv_only_ready(
    proposer: Any, model: Any, blocker: Callable[[Any], str | None], build: Callable[[Any, Any], Any]
) -> Any:
    """The proposer's KV-only pass, built once; None where it cannot run (`blocker(proposer)`:
    the runner's own reasons, asked only the first time, since the connector check reads
    code). `build(proposer, model)` makes the pass (raising `KvOnlyUnsupported` with the reason).
    Decided once per proposer, reported as the `kv_only_pass` engine feature."""
    cached = getattr(proposer, "_pdspec_kv_only_cache", False)
    if cached is not False:
        return cached
    reason = blocker(proposer)
    built = None
    if not reason:
        try:
            built = build(proposer, model)
        except KvOnlyUnsupported as exc:
            reason = str(exc)
        except Exception as exc:  # internals other than the feature checks saw
            reason = f"cannot be built on this drafter ({type(exc).__name__}: {exc})"
    if reason:
        log.warning("pdspec: KV-only drafter pass off (%s); K=0 steps run the full drafter pass", reason)
    else:
        log.warning("pdspec: KV-only drafter pass on for K=0 steps (%s)", type(model).__name__)
    features.report(features.KV_ONLY_PASS, built is not None, reason or "")
    proposer._pdspec_kv_only_cache = built
    return built


def give_up(proposer: Any) -> None:
    """A pass that fails (a vLLM build whose internals differ from what the feature checks
    saw) turns itself off for this process: logged once, K=0 steps back on vLLM's path."""
    log.exception("pdspec: KV-only drafter pass failed; K=0 steps run the full drafter pass from now on")
    features.report(features.KV_ONLY_PASS, False, "failed at run time (see the worker log); full pass from then on")
    proposer._pdspec_kv_only_cache = None


def decide_at_load(cls: type, blocker, build) -> None:
    """Decide (and report) the pass when the drafter is loaded, not at the first K=0 step,
    so a worker shows whether it is on before any traffic. A failure here leaves the
    decision to the first K=0 step."""
    wrap_once(cls, "load_model", "kv_only_decide_at_load", lambda original: _deciding_at_load(original, blocker, build))


def _deciding_at_load(original: Any, blocker, build) -> Any:
    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            kv_only_ready(self, unwrap(self.model), blocker, build)
        except Exception:  # noqa: BLE001 (an attribute this build lacks: decided later)
            log.debug("pdspec: KV-only pass not decided at load", exc_info=True)
        return result

    return load_model


def unwrap(model: Any) -> Any:
    """The drafter inside vLLM's CUDA-graph wrapper, if it has one."""
    inner = getattr(model, "unwrap", None)
    return inner() if callable(inner) else model


_KV_ONLY_FLAG: LiveFlag | None = None


def kv_only_flag() -> LiveFlag:
    """The process's KV-only switch (made anew if the environment names another file, as
    when a benchmark starts a second in-process engine)."""
    global _KV_ONLY_FLAG
    path = os.environ.get(KV_ONLY_FILE_ENV)
    if _KV_ONLY_FLAG is None or str(_KV_ONLY_FLAG.file.path or "") != (path or ""):
        _KV_ONLY_FLAG = LiveFlag.kv_only_from_env()
    return _KV_ONLY_FLAG


def v1_k0_wrapper(
    original: Any,
    flag: LiveFlag | None,
    blocker: Callable[[Any], str | None],
    build: Callable[[Any, Any], Any],
    kv_only_propose: Callable[..., Any],
) -> Any:
    """A V1 proposer's `propose` whose K=0 calls go to `kv_only_propose(self, model, ...)`
    while the switch is on and the pass could be built (`blocker`, `build`); everything
    else, and a pass that fails, goes to vLLM's own `original`."""

    @functools.wraps(original)
    def propose(self, num_speculative_tokens, *args, **kwargs):
        if num_speculative_tokens != 0 or not (flag or kv_only_flag()).current():
            return original(self, num_speculative_tokens, *args, **kwargs)
        model = unwrap(self.model)
        if kv_only_ready(self, model, blocker, build) is None:
            return original(self, num_speculative_tokens, *args, **kwargs)
        try:
            return kv_only_propose(self, model, *args, **kwargs)
        except Exception:
            give_up(self)  # the full pass below rewrites every slot the pass touched
            return original(self, num_speculative_tokens, *args, **kwargs)

    return propose


def v1_k0_inputs(
    self: Any,
    model: Any,
    target_token_ids: Any,
    target_positions: Any,
    target_hidden_states: Any,
    next_token_ids: Any,
    token_indices_to_sample: Any,
    common_attn_metadata: Any,
    sampling_metadata: Any,
    mm_embed_inputs: Any = None,
    num_rejected_tokens_gpu: Any = None,
    slot_mappings: Any = None,
) -> tuple[int, int, Any]:
    """What vLLM's V1 `propose` does before its drafter forward, for a K=0 step: the
    drafter's inputs from vLLM's own `set_inputs_first_pass` (so the same tokens go to the
    same slots). Returns the batch size, the drafter's token count and its attention
    metadata (the arguments are `propose`'s after K)."""
    self.num_speculative_tokens = 0
    self._last_draft_probs = None
    hidden_states = model.combine_hidden_states(target_hidden_states)
    num_tokens, _, cad = self.set_inputs_first_pass(
        target_token_ids=target_token_ids,
        next_token_ids=next_token_ids,
        target_positions=target_positions,
        target_hidden_states=hidden_states,
        token_indices_to_sample=token_indices_to_sample,
        cad=common_attn_metadata,
        num_rejected_tokens_gpu=num_rejected_tokens_gpu,
    )
    return common_attn_metadata.batch_size(), num_tokens, cad


def kv_only_pass(self: Any, kv_pass: Any, *args: Any) -> None:
    # A method of the proposer so profilers (loadtest/engine_bench/profile_k0.py) can find and time it.
    kv_pass.run(*args)
    features.KV_ONLY_PASSES.inc()
