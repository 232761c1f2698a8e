"""The prefill worker: vLLM with NixlConnector as `kv_producer`.

It computes the prompt's KV (the drafter's layers included) for a one-token request and
keeps it for the decode worker to pull. Its drafts would never be used, so pdspec's
engine plugin makes it propose with K=0, and its K=0 steps write only the drafter's KV.

- role.py: what makes a worker a prefill worker, as plain data (ports, core, features, and
  the engine hooks and scheduler by name)
- worker.py: `pdspec prefill`
- engine/: what only a prefill worker runs inside vLLM (the KV-only pass, kv_hold_wait)
"""
