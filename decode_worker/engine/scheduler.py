"""The decode worker's scheduler: the shared K=0 rule (pdspec/worker/engine/k0_scheduler.py)
with the stale-KV guard (stale_kv.py) in front of it, in one class because vLLM takes one
`--scheduler-cls` (decode_worker/role.py names this one)."""

from __future__ import annotations

from decode_worker.engine.stale_kv import StaleKvMixin
from pdspec.worker.engine.k0_scheduler import K0Scheduler


class DecodeScheduler(K0Scheduler):
    """`K0Scheduler` with the stale-KV guard first: a request whose remote KV may have
    expired loses its `kv_transfer_params` before vLLM's scheduler sees it."""

    FRONT = (StaleKvMixin,)
