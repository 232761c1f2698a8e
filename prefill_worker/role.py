"""What makes a worker a prefill worker.

It computes the prompt's KV (the drafter's layers included) for a one-token request and
keeps it for the decode worker to pull (NixlConnector `kv_producer`). Its drafts would
never be used, so it proposes with K=0, and its K=0 steps write only the drafter's KV
(the KV-only pass); with data parallelism an idle rank votes "skip drafts" too. Its API
server never fails a prefill leg's reply after the engine parked the KV
(prefill_worker/reply_guard.py).
"""

from pdspec.worker.role_spec import RoleSpec

ROLE = RoleSpec(
    name="prefill",
    kv_role="kv_producer",
    port=8100,
    side_channel_port=5600,
    kv_events_port=5650,
    cpu_core="0",
    features=("k0_rule", "kv_only_pass", "nixl_progress_delay", "kv_core_pinning", "dp_idle_rank_vote",
              "kv_hold_wait", "short_spin", "prefill_reply_guard"),
    hooks=("cpu_affinity", "kv_only", "dp_vote", "kv_hold_wait", "short_spin", "testing_hooks"),
)
