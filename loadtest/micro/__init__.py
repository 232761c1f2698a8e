"""Micro-benchmarks: the proxy's own overhead (with an instant stand-in worker) and NIXL reads."""
