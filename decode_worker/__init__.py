"""The decode worker: vLLM with NixlConnector as `kv_consumer`.

It pulls the prompt's KV from the prefill worker named in `kv_transfer_params`, then
decodes with the full speculative K.

- role.py: what makes a worker a decode worker, as plain data (ports, core, features, and
  the engine hooks and scheduler by name)
- worker.py: `pdspec decode`
- engine/: what only a decode worker runs inside vLLM (the stale-KV guard, its scheduler)
"""
