"""Routing: which worker of a pool serves a leg (the policies), the route plan and the P/D
decision, and the index of the workers' KV caches that cache-aware routing reads."""
