"""The V2 runner's DFlash K=0 step as one CUDA graph replay (vLLM 0.33, GPU).

On a K=0 step vLLM's DFlash speculator writes only the context K/V, but eagerly, outside
any CUDA graph (its own docstring: the context's shape differs from the query's): the
concatenation of the target's aux hidden states, the fc, a copy into `hidden_states`, the
hidden norm, one GEMM for every layer's K/V, the K norm, RoPE and a cache write per layer.
On the H200 that is 0.39 ms of a 16.9 ms step at mbt 512 (kv_only/h200-dflash-worker).

Here the same sequence, from the fc on, is captured once per batch size when vLLM
captures the speculator's graphs, and a K=0 step of a captured size stages vLLM's own
concatenation into a fixed buffer and replays it: one launch instead of about a dozen,
and no host gaps between them. Sizes are replayed exactly, never padded (a GEMM of
another height may take another kernel): the engine's max_num_batched_tokens, which is
every step of a busy prefill worker (chunked prefill fills the token budget), and vLLM's
CUDA-graph capture sizes below it. Any other size, a dummy or profiling run, or the
switch off (`PDSPEC_KV_ONLY_DRAFTER_FILE`), runs vLLM's eager path; so does everything
after a capture or replay that fails (logged).

Every input the graph reads lives at a fixed address: the staging buffer (ours), the
speculator's `hidden_states`, `context_positions` and context slot mappings (filled by
vLLM's input kernel each step), the weights and the KV caches. The same kernels run on
the same shapes, so the cache should be bitwise the eager path's; the test-only
`PDSPEC_TEST_DFLASH_GRAPH_VERIFY_STEPS=N` checks that on a live engine: for the first N
graph steps it snapshots the drafter's KV caches after the replay, reruns vLLM's eager
path over the same slots and compares (`pdspec_kv_only_graph_verified_total{result}`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from prometheus_client import Counter

from pdspec.worker.engine import features

log = logging.getLogger("pdspec.engine")

VERIFY_STEPS_ENV = "PDSPEC_TEST_DFLASH_GRAPH_VERIFY_STEPS"

GRAPH_VERIFIED = Counter(
    "pdspec_kv_only_graph_verified",
    "Test-only: graph steps whose drafter KV was compared with vLLM's eager path's, by result.",
    ["result"],
)


def graph_sizes(max_num_tokens: int, capture_sizes: list[int] | None) -> list[int]:
    """The batch sizes to capture, largest first (graphs of one memory pool capture
    largest first so the smaller ones reuse its blocks)."""
    sizes = {max_num_tokens} | {s for s in (capture_sizes or []) if 0 < s <= max_num_tokens}
    return sorted(sizes, reverse=True)


class DFlashContextGraphs:
    """One CUDA graph per batch size of a DFlash speculator's K=0 context step."""

    def __init__(self, speculator: Any, model: Any, verify_steps: int = 0) -> None:
        """`model`: the unwrapped drafter (its `combine_hidden_states` and
        `precompute_and_store_context_kv`)."""
        import torch

        self.speculator = speculator
        self.model = model
        inner = getattr(model, "model", model)
        width = inner.fc.input_size  # the aux hidden states, concatenated
        self.staging = torch.zeros(
            speculator.max_num_tokens,
            width,
            dtype=speculator.hidden_states.dtype,
            device=speculator.hidden_states.device,
        )
        self.graphs: dict[int, Any] = {}
        self.verify_left = verify_steps

    def _body(self, num_tokens: int) -> None:
        """The K=0 context step from the fc on, as vLLM writes it (`_store_hidden_states`
        without graph rows, then `_precompute_context_kv`)."""
        sp = self.speculator
        sp.hidden_states[:num_tokens].copy_(self.model.combine_hidden_states(self.staging[:num_tokens]))
        sp._pdspec_eager_precompute(0, num_tokens)

    def capture(self, sizes: list[int]) -> None:
        """Captures one graph per size (the speculator's context slots must hold
        PAD_SLOT_ID, as vLLM's own capture leaves them: nothing is written to the cache)."""
        import torch
        from vllm.v1.attention.backends.utils import PAD_SLOT_ID

        self.speculator._context_slot_mappings.fill_(PAD_SLOT_ID)  # vLLM's capture leaves them so; make sure
        # A pool of our own: vLLM's global pool holds its graphs' outputs as memory it
        # considers free (weak references), which a replay of ours must never overwrite.
        pool = torch.cuda.graph_pool_handle()
        for size in sizes:
            self._body(size)  # warm-up: lazy buffers, cuBLAS handles
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._body(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def stage(self, num_tokens: int, aux_hidden_states: list[Any]) -> bool:
        """Stages a K=0 step's aux hidden states (vLLM's own concatenation, into the fixed
        buffer); False if this size has no graph (then vLLM's path runs)."""
        import torch

        if num_tokens not in self.graphs or not aux_hidden_states:
            return False
        torch.cat([h[:num_tokens] for h in aux_hidden_states], dim=-1, out=self.staging[:num_tokens])
        return True

    def replay(self, num_tokens: int) -> None:
        self.graphs[num_tokens].replay()
        features.KV_ONLY_GRAPH_REPLAYS.inc()
        if self.verify_left > 0:
            self.verify_left -= 1
            self._verify(num_tokens)

    def _verify(self, num_tokens: int) -> None:
        """Test-only: the drafter KV the replay wrote against vLLM's eager path over the
        same slots (the eager path overwrites them; every other slot is untouched by both)."""
        import torch

        caches = [attn.kv_cache for attn in getattr(self.model, "model", self.model)._attn_layers]
        after_graph = [c.clone() for c in caches]
        self._body(num_tokens)  # eagerly, over the same staged rows and slots
        equal = all(torch.equal(a, b) for a, b in zip(after_graph, caches))
        del after_graph
        GRAPH_VERIFIED.labels("equal" if equal else "differ").inc()
        (log.info if equal else log.error)(
            "pdspec: DFlash context graph, %d tokens: drafter KV %s the eager path's",
            num_tokens,
            "equals" if equal else "DIFFERS FROM",
        )


def verify_steps_from_env() -> int:
    try:
        return max(0, int(os.environ.get(VERIFY_STEPS_ENV, "0")))
    except ValueError:
        return 0
