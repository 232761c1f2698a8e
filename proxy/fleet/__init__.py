"""The fleet: the worker pools and their workers, membership (static or DNS), active health
checks, the pairing check and what a worker says about itself (pdspec_worker_info)."""
