"""The prefill worker: vLLM with NixlConnector as `kv_producer`.

It computes the prompt's KV (the drafter's layers included) for a one-token request and
keeps it for the decode worker to pull. Its drafts would never be used, so pdspec's
engine plugin makes it propose with K=0.
"""
