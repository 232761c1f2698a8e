"""What makes a worker a decode worker.

It pulls the prompt's KV from the prefill worker over NIXL (NixlConnector `kv_consumer`)
and decodes with the full K; the K=0 rule still applies to its steps where no request can
use a draft (a request sure to reach its max_tokens).
"""

from pdspec.worker.role_spec import RoleSpec

ROLE = RoleSpec(
    name="decode",
    kv_role="kv_consumer",
    port=8200,
    side_channel_port=5700,
    kv_events_port=5750,
    cpu_core="1",
    features=("k0_rule", "nixl_progress_delay", "kv_core_pinning", "stale_kv_guard", "short_spin"),
    hooks=("cpu_affinity", "short_spin", "testing_hooks"),  # testing_hooks: nothing unless `test_hooks` is on
)
