"""A request's flow through P/D: the prefill leg, the KV hand-off, the decode leg and the
relay to the client, with their retries, early decode and fan-out."""
