"""What only a prefill worker runs inside vLLM's processes.

- kv_only/: the KV-only drafter pass, K=0 steps that write the drafter's KV without the
  rest of its forward (EAGLE3 and DFlash; its kernels, the connector check, DFlash's
  context graphs)
- kv_hold_wait.py: with only KV held for reads, wait for work instead of stepping

The cut: a module lives here when no other role runs it; what every worker runs (control
files, counters, features, the K=0 rule, the DP vote, CPU pinning, the short spin, the test
hooks) stays in pdspec/worker/engine/. Imports go one way, from here to
pdspec.worker.engine, never back (tests/unit/test_layout.py checks it);
prefill_worker/role.py names the hooks pdspec's plugin installs from here.
"""
