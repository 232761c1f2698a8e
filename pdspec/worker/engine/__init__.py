"""pdspec's engine hooks: the code that runs inside vLLM's processes, one module per concern.

- control.py: environment names and the live settings files (no vLLM, no metrics)
- metrics.py, features.py: the counters, and each feature's on/off state
- capabilities.py: what this vLLM build offers (feature detection)
- k0_scheduler.py: the K=0 rule in vLLM's scheduler (`--scheduler-cls`)
- dp_vote.py: an idle data-parallel rank's vote (V2 runner)
- kv_only_kernels.py, kv_only.py, connector_hooks.py: the KV-only drafter pass and where it runs
- cpu_affinity.py: NixlConnector's KV core on CPU builds
- testing_hooks.py: the drafter-KV tests' negative control and the decode worker's dump of received drafter KV
pdspec/worker/plugin.py, vLLM's general-plugin entry point, maps a worker's role to what is
installed in each process.
"""
