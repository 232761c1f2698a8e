"""The engine plugin's counters (prefix `pdspec_`), created in vLLM's engine-core process.
With PROMETHEUS_MULTIPROC_DIR set (pdspec's launcher sets it) they appear on the API
server's /metrics beside vLLM's own. The engine features' gauge and the KV-only pass's
counter live in features.py."""

from __future__ import annotations

from prometheus_client import Counter

PROPOSALS = Counter("pdspec_proposals", "Engine steps in which the speculative drafter ran.")
K0_PROPOSALS = Counter("pdspec_k0_proposals", "Drafter steps that proposed with K=0 (drafts unusable).")
# K>0 steps taken while the policy was `auto`: what the "prefill worker drafting under
# auto" alert reads. Counted here, at the step, because a rate of proposals minus K=0
# proposals joined with the *current* policy also counts steps made under `always`
# before a switch back to `auto` (a false alarm after every A/B benchmark).
K_POSITIVE_AUTO_PROPOSALS = Counter(
    "pdspec_k_positive_auto_proposals", "Drafter steps that proposed with K>0 while the drafts policy was auto."
)
DRAFT_TOKENS_SKIPPED = Counter(
    "pdspec_draft_tokens_skipped", "Draft tokens not proposed because no request could use them."
)
# The counters above are the scheduler's decision. On vLLM 0.33's V2 runner with data
# parallelism the ranks then AND their "skip drafts" votes, so what a rank really ran can
# differ: these count the runner's own steps (dummy batches of idle ranks left out).
RUNNER_PROPOSALS = Counter(
    "pdspec_runner_proposals", "V2 runner steps with a drafter, as run after the data-parallel ranks agreed on K."
)
RUNNER_K0_PROPOSALS = Counter(
    "pdspec_runner_k0_proposals", "V2 runner steps whose drafter ran with K=0, after the data-parallel agreement."
)
STALE_KV_RECOMPUTED = Counter(
    "pdspec_stale_kv_recomputed",
    "Decode requests prefilled here because their prefill worker's KV lease may have run out before the "
    "scheduler got them (stale_kv.py).",
)
