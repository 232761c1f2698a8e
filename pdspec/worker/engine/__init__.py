"""pdspec's engine hooks, one module per concern (the rest still lives in
pdspec/worker/engine_plugin.py)."""
