"""What makes a worker a prefill worker.

It computes the prompt's KV (the drafter's layers included) for a one-token request and
keeps it for the decode worker to pull (NixlConnector `kv_producer`). Its drafts would
never be used, so it proposes with K=0, and its K=0 steps write only the drafter's KV
(the KV-only pass); with data parallelism an idle rank votes "skip drafts" too. Its API
server never fails a prefill leg's reply after the engine parked the KV
(prefill_worker/reply_guard.py).

Plain data with no imports (pdspec/worker/roles.py reads it into a `RoleSpec`): the
settings take their defaults from here and the proxy imports the settings, so reading a
role must not import the worker's code. Engine code is named as text, `module:function`
for a hook the vLLM plugin installs in every process of the role (in this order) and
`module.Class` for the scheduler vLLM is started with; `SERVER_HOOKS`, in the same form,
are installed in the API server's process only (by pdspec.worker.serve).
"""

NAME = "prefill"
KV_ROLE = "kv_producer"  # NixlConnector's role
PORT = 8100  # default HTTP port in `pdspec up`
SIDE_CHANNEL_PORT = 5600  # default NIXL side-channel port
KV_EVENTS_PORT = 5650  # default port of its KV-event publisher (the replay port is the next one up)
CPU_CORE = "0"  # default VLLM_CPU_OMP_THREADS_BIND on the CPU build
FEATURES = (
    "k0_rule",
    "kv_only_pass",
    "nixl_progress_delay",
    "kv_core_pinning",
    "dp_idle_rank_vote",
    "kv_hold_wait",
    "short_spin",
    "cpu_expand_fix",
    "in_core_worker",
    "prefill_reply_guard",
)
HOOKS = (
    "pdspec.worker.engine.cpu_affinity:install_cpu_affinity_fix",
    "prefill_worker.engine.kv_only.install:install_kv_only_drafter",
    "pdspec.worker.engine.dp_vote:install_dp_vote",
    "prefill_worker.engine.kv_hold_wait:install_kv_hold_wait",
    "pdspec.worker.engine.short_spin:install_short_spin",
    "pdspec.worker.engine.testing_hooks:install_test_hooks",  # its skip-drafter switch, only with `test_hooks` on
)
# In the API server's process only (pdspec.worker.serve): its replies to prefill legs.
SERVER_HOOKS = ("prefill_worker.reply_guard:install_reply_guard",)
SCHEDULER_CLS = "pdspec.worker.engine.k0_scheduler.K0Scheduler"
