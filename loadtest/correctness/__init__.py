"""Correctness harnesses run by the e2e tests and by hand on a GPU: K=0 equivalence and the KV-only pass's KV equality."""
