"""The KV-only drafter pass of a prefill worker: on a K=0 step, write the drafter's KV (what
NIXL moves to the decode worker) without the rest of its forward.

- install.py: the `kv_only` hook; installs the pass on whichever runners this vLLM has
- proposer_pass.py: what every drafter's pass shares (switch, decision, fallback, V1 wrapper)
- eagle3.py, kernels.py: EAGLE3's pass, where it runs (V1 and V2 runners) and the pass itself
- dflash.py, dflash_context_graph.py: DFlash's pass (V1), and its K=0 context step as CUDA
  graphs (V2)
- connector_hooks.py: whether the KV connector allows it (its layer hooks do nothing)

Imports go install -> eagle3, dflash -> proposer_pass, kernels, connector_hooks: the drafter
modules never import each other or install.py.
"""
