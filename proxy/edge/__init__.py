"""The client-facing HTTP edge beside the generation endpoints: the client connections and
their limits, and the endpoints passed whole to a worker."""
