"""What makes a worker a decode worker.

It pulls the prompt's KV from the prefill worker over NIXL (NixlConnector `kv_consumer`)
and decodes with the full K; the K=0 rule still applies to its steps where no request can
use a draft (a request sure to reach its max_tokens). Its scheduler puts the stale-KV guard
in front of the K=0 rule.

Plain data with no imports, as prefill_worker/role.py explains.
"""

NAME = "decode"
KV_ROLE = "kv_consumer"  # NixlConnector's role
PORT = 8200  # default HTTP port in `pdspec up`
SIDE_CHANNEL_PORT = 5700  # default NIXL side-channel port
KV_EVENTS_PORT = 5750  # default port of its KV-event publisher (the replay port is the next one up)
CPU_CORE = "1"  # default VLLM_CPU_OMP_THREADS_BIND on the CPU build
FEATURES = (
    "k0_rule",
    "nixl_progress_delay",
    "kv_core_pinning",
    "stale_kv_guard",
    "short_spin",
    "cpu_expand_fix",
    "in_core_worker",
)
HOOKS = (
    "pdspec.worker.engine.cpu_affinity:install_cpu_affinity_fix",
    "pdspec.worker.engine.short_spin:install_short_spin",
    "pdspec.worker.engine.testing_hooks:install_test_hooks",  # its drafter-KV dump, only with `test_hooks` on
)
SERVER_HOOKS = ()  # nothing in its API server's process
SCHEDULER_CLS = "decode_worker.engine.scheduler.DecodeScheduler"
