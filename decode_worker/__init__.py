"""The decode worker: vLLM with NixlConnector as `kv_consumer`.

It pulls the prompt's KV from the prefill worker named in `kv_transfer_params`, then
decodes with the full speculative K.
"""
