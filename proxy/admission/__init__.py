"""Admission: how many requests run and wait (the queue), and, on the prefill workers, the KV
room and the queued prefill time a leg waits for."""
