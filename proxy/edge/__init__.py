"""The client-facing HTTP edge: the generation endpoints (one per API, plain ASGI), the
client connections and their limits, and the endpoints passed whole to a worker."""
