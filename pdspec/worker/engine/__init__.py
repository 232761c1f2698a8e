"""pdspec's shared engine hooks: the code that runs inside every P/D worker's vLLM processes,
one module per concern.

- control.py: environment names and the live settings files (no vLLM, no metrics)
- metrics.py, features.py: the counters, and each feature's on/off state
- capabilities.py: what this vLLM build offers (feature detection)
- k0_scheduler.py: the K=0 rule in vLLM's scheduler (`--scheduler-cls`)
- dp_vote.py: an idle data-parallel rank's vote (V2 runner)
- cpu_affinity.py: NixlConnector's KV core on CPU builds
- short_spin.py: CPU builds: vLLM's shared-memory queue readers spin milliseconds, not a second
- cpu_expand_fix.py: CPU builds, the rejection sampler's per-draft temperature (vLLM's fallback left it unset)
- in_core_worker.py: CPU builds: a one-process engine's model runs in vLLM's engine core (no worker process)
- seeded_first_step.py: a seeded request's one-token first step without vLLM's placeholder drafts
- wrap_once.py: the one way pdspec patches vLLM (a marker per patch)
- testing_hooks.py: the drafter-KV tests' negative control and the decode worker's dump of received drafter KV

What only one role runs lives in that role's package: prefill_worker/engine/ (the KV-only
drafter pass, kv_hold_wait), decode_worker/engine/ (the stale-KV guard). Those import this
package, never the reverse. pdspec/worker/plugin.py, vLLM's general-plugin entry point,
installs in each process the hooks the worker's role.py names.
"""
