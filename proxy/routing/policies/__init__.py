"""The routing policies, one module each behind proxy/routing/policy.py's `Policy`; the
registry (proxy/routing/registry.py) names them and builds them with their weights."""
