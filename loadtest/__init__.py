"""pdspec's benchmarks and load tools, by kind:

- `loadtest.serving`: load through the proxy (`pdspec bench` and its stacks, serve_bench,
  the soak, hostile clients, the hand-off probe, the DP-vote reader);
- `loadtest.engine_bench`: in-process engines built as the workers build them (the
  prefill-only K=0 benchmark, the K=0 step profiler);
- `loadtest.correctness`: the K=0 equivalence and KV-only equality harnesses;
- `loadtest.micro`: the proxy's own overhead, NIXL reads;
- `loadtest/gpu/`: shell scripts for the lent GPU machines.

The top-level modules (`python -m loadtest.serve_bench`, ...) are thin entries kept so
the commands in the README keep working.
"""
