"""Every engine feature of pdspec says whether it is on where it runs, and why not.

The KV-only drafter pass was measured at 0.99 of no-drafter in an engine without a KV
connector while every P/D prefill worker ran with it off, and nothing showed it. So each
feature reports its state once it is decided, in the process that decides it:

    pdspec_engine_feature{feature, state="on"|"off", reason} 1

`reason` is empty when on and one line when off. A state that changes (the KV-only pass
giving up after a failure) sets the old series to 0. The gauge is written in vLLM's
engine and worker processes; with PROMETHEUS_MULTIPROC_DIR set (pdspec's launcher sets
it) the API server's /metrics shows it, taking the largest value over processes.

`pdspec_kv_only_passes_total` counts the K=0 steps whose drafter KV the KV-only pass
wrote: on a prefill worker with the pass on, it equals `pdspec_k0_proposals_total`.

Which features a role has: its role.py (`FEATURES`, gathered in pdspec/worker/roles.py's
`ROLE_FEATURES`; this module, shared engine code, imports no role package). Only those are
reported by that role's worker, so a decode worker never shows a prefill-only feature as off.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge

from pdspec.contract import ENGINE_FEATURE_METRIC

log = logging.getLogger("pdspec.engine.features")

K0_RULE = "k0_rule"  # propose with K=0 when no scheduled request can use the drafts
KV_ONLY_PASS = "kv_only_pass"  # K=0 steps write the drafter KV without the rest of its forward
NIXL_PROGRESS_DELAY = "nixl_progress_delay"  # NIXL's progress thread sleeps instead of spinning
KV_CORE_PINNING = "kv_core_pinning"  # CPU: NixlConnector's KV core stays among the worker's cores
DP_IDLE_RANK_VOTE = "dp_idle_rank_vote"  # an idle DP rank votes "skip drafts" on a prefill worker
STALE_KV_GUARD = "stale_kv_guard"  # decode: a prefill's KV whose lease may have run out is not read
KV_HOLD_WAIT = "kv_hold_wait"  # prefill: with only KV held for reads, wait for work instead of stepping
SHORT_SPIN = "short_spin"  # CPU: vLLM's shared-memory readers spin milliseconds, not a second, before sleeping
CPU_EXPAND_FIX = "cpu_expand_fix"  # CPU: the rejection sampler's per-draft temperature is the request's (issue 39)
IN_CORE_WORKER = "in_core_worker"  # CPU: the model runs in vLLM's engine-core process, no worker process
# prefill, API server: a prefill leg's reply never fails after its engine parked the KV
PREFILL_REPLY_GUARD = "prefill_reply_guard"
FEATURES = (
    K0_RULE,
    KV_ONLY_PASS,
    NIXL_PROGRESS_DELAY,
    KV_CORE_PINNING,
    DP_IDLE_RANK_VOTE,
    STALE_KV_GUARD,
    KV_HOLD_WAIT,
    SHORT_SPIN,
    CPU_EXPAND_FIX,
    IN_CORE_WORKER,
    PREFILL_REPLY_GUARD,
)

ENGINE_FEATURE = Gauge(
    ENGINE_FEATURE_METRIC,
    "pdspec's engine features: 1 for the feature's current state (on, or off with the reason).",
    ["feature", "state", "reason"],
    multiprocess_mode="max",
)
KV_ONLY_PASSES = Counter("pdspec_kv_only_passes", "K=0 steps whose drafter KV was written by the KV-only pass.")
# Here rather than in prefill_worker/engine/kv_only/ (dflash_context_graph.py is imported only
# where vLLM's V2 runner captures graphs), so every worker exports the series and the
# dashboard shows 0, not "no data".
KV_ONLY_GRAPH_REPLAYS = Counter(
    "pdspec_kv_only_graph_replays", "K=0 steps whose KV-only pass ran as one CUDA graph replay (DFlash, V2 runner)."
)

_reported: dict[str, tuple[str, str]] = {}


def report(feature: str, on: bool, reason: str = "") -> None:
    """Records `feature`'s state in this process (logged when it changes)."""
    state = ("on", "") if on else ("off", reason or "no reason given")
    previous = _reported.get(feature)
    if previous == state:
        return
    if previous is not None:
        ENGINE_FEATURE.labels(feature, *previous).set(0)
    ENGINE_FEATURE.labels(feature, *state).set(1)
    _reported[feature] = state
    if on:
        log.info("pdspec: engine feature %s on", feature)
    else:
        log.warning("pdspec: engine feature %s off: %s", feature, state[1])


def reported() -> dict[str, tuple[str, str]]:
    """This process's states, {feature: (state, reason)} (for tests and logs)."""
    return dict(_reported)
