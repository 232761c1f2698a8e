"""Pairing safety: never pair a prefill and a decode worker whose KV would not fit.

Each pdspec worker exports `pdspec_worker_info` (pdspec/worker/worker_info.py). A decode
worker reads the prefill worker's KV blocks, its drafter's layers included, so both must
run the same target model, the same drafter and method, the same KV block size, and the
same KV connector direction (pull or push: a push decode worker waits for a WRITE a pull
prefill worker never sends).
NIXL's handshake catches some of this only when the first request is already on its
way (a 500), and not all of it. `num_speculative_tokens` may differ (vLLM does not hash
it, and the prefill worker proposes with K=0 anyway), as may the drafts policy.

The rule: every admitted worker, in both pools, agrees with one reference config, so any
prefill worker may hand off to any decode worker.
- Fields in `proxy.health.expected_worker_config` must equal the values given there.
- The other fields must equal the *reference*: chosen, when there is none, among the
  healthy workers whose info is known (and that match the expected values): the config
  that both pools have, held by the most workers (ties: configured order, prefill pool
  first); if no config is on both sides, the first prefill worker's (the KV source), so
  the decode workers are the ones refused. The reference then stays while any healthy
  worker holds it: a worker that comes back with another config is refused, it does not
  move the reference. When no healthy worker holds it any more (every worker restarted
  with a new config), it is chosen again.
- A worker whose /metrics has no `pdspec_worker_info` (plain vLLM) is admitted unverified,
  with a warning, or refused: `proxy.health.unverified_workers` (default `admit`).
- A worker whose info could not be read yet (/metrics failed) is not admitted until it
  is read.
A refused worker takes no requests; `/ready` names it, the fields and the worker it
differs from; `pdspec_proxy_pairing_refusals_total{pool,field}` counts each refusal and a
WARNING names both workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pdspec.settings import HealthSettings
from proxy.fleet.pool import Worker, WorkerPool
from proxy.fleet.worker_info import PAIRING_FIELDS

log = logging.getLogger("pdspec.proxy.pairing")

EXPECTED = "proxy.health.expected_worker_config"
NO_INFO = "worker_info"  # the "field" of a refusal for a worker that exports no info


# What a field reads as when a worker's info lacks it: workers from before pdspec exported
# `kv_connector` all pulled (vLLM's NixlConnector), so an upgrade pairs old with new.
FIELD_DEFAULTS = {"kv_connector": "pull"}


def field_of(info: dict[str, str] | None, name: str) -> str:
    return (info or {}).get(name, FIELD_DEFAULTS.get(name, ""))


def config_of(worker: Worker) -> tuple[str, ...]:
    return tuple(field_of(worker.info, name) for name in PAIRING_FIELDS)


class Pairing:
    def __init__(
        self,
        expected: dict[str, object] | None = None,
        unverified: str = "admit",
        count_refusal: Callable[[str, str], None] | None = None,
    ) -> None:
        self.expected = {name: str(value) for name, value in (expected or {}).items()}
        self.unverified = unverified
        self.count_refusal = count_refusal or (lambda pool, field: None)
        self.reference: dict[str, str] | None = None  # learned from workers: every pairing field

    @classmethod
    def from_settings(
        cls, settings: HealthSettings, count_refusal: Callable[[str, str], None] | None = None
    ) -> Pairing:
        """The pairing check the `health` group describes (expected_worker_config, unverified_workers)."""
        return cls(settings.expected_worker_config, settings.unverified_workers, count_refusal)

    # --- deciding ----------------------------------------------------------------------

    def update(self, pools: list[WorkerPool]) -> None:
        """Admit or refuse every healthy worker (synchronous: no request is routed while
        a decision is half made)."""
        live = [(pool, w) for pool in pools for w in pool.workers if w.healthy]
        known = [(pool, w) for pool, w in live if w.info_read_at is not None and w.info is not None]
        self.reference = self._choose_reference(pools, [(p, w) for p, w in known if self._meets_expected(w)])
        for pool, worker in live:
            self._decide(pool, worker, known)
        for pool in pools:
            for worker in pool.workers:
                if not worker.healthy:
                    worker.refusal = None  # judged again, on fresh info, when it answers again

    def _meets_expected(self, worker: Worker) -> bool:
        info = worker.info or {}
        return all(field_of(info, name) == value for name, value in self.expected.items())

    def _choose_reference(self, pools: list[WorkerPool], known: list[tuple[WorkerPool, Worker]]) -> dict | None:
        if self.reference is not None:
            held = tuple(self.reference[name] for name in PAIRING_FIELDS)
            if any(config_of(w) == held for _, w in known):
                return self.reference
        groups: dict[tuple[str, ...], list[WorkerPool]] = {}
        for pool, worker in known:  # prefill pool first, in configured order
            groups.setdefault(config_of(worker), []).append(pool)
        if not groups:
            return None
        on_both_sides = [config for config, members in groups.items() if set(members) >= set(pools)]
        chosen = max(on_both_sides, key=lambda c: len(groups[c])) if on_both_sides else next(iter(groups))
        reference = dict(zip(PAIRING_FIELDS, chosen))
        if reference != self.reference:
            log.info("pairing reference: %s", reference)
        return reference

    def _decide(self, pool: WorkerPool, worker: Worker, known: list[tuple[WorkerPool, Worker]]) -> None:
        if worker.info_read_at is None:  # not read since it (re)joined, or /metrics failed
            worker.admitted, worker.refusal = False, None
            return
        if worker.info is None:
            if self.unverified == "admit":
                self._admit(pool, worker)
            else:
                self._refuse(
                    pool,
                    worker,
                    {NO_INFO: {"worker": "absent", "reference": "required"}},
                    "proxy.health.unverified_workers=refuse",
                )
            return
        reference = {**(self.reference or {}), **self.expected}
        differing = {
            name: {"worker": field_of(worker.info, name), "reference": reference[name]}
            for name in PAIRING_FIELDS
            if name in reference and field_of(worker.info, name) != reference[name]
        }
        if not differing:
            self._admit(pool, worker)
        elif set(differing) <= set(self.expected):
            self._refuse(pool, worker, differing, EXPECTED)
        else:
            self._refuse(pool, worker, differing, self._holder(pool, known))

    def _holder(self, pool: WorkerPool, known: list[tuple[WorkerPool, Worker]]) -> str:
        """A worker holding the reference, from the other pool if one does (the worker
        the refused one would have been paired with)."""
        held = tuple((self.reference or {}).get(name, "") for name in PAIRING_FIELDS)
        holders = [(p, w) for p, w in known if config_of(w) == held]
        holders.sort(key=lambda pw: pw[0] is pool)  # other pool first; stable otherwise
        if not holders:
            return "the pairing reference"
        other_pool, other = holders[0]
        return f"{other_pool.name} worker {other.url}"

    def _admit(self, pool: WorkerPool, worker: Worker) -> None:
        if worker.refusal is not None:
            log.warning("%s worker %s now matches the pairing reference; admitted", pool.name, worker.url)
        worker.admitted, worker.refusal = True, None

    def _refuse(self, pool: WorkerPool, worker: Worker, differing: dict, against: str) -> None:
        previous = worker.refusal
        worker.admitted = False
        worker.refusal = {"pool": pool.name, "worker": worker.url, "against": against, "fields": differing}
        if previous is not None and previous["fields"] == differing:
            return  # already refused for this; say it once
        for name in differing:
            self.count_refusal(pool.name, name)
        details = ", ".join(f"{name} {d['worker']!r} vs {d['reference']!r}" for name, d in differing.items())
        log.warning(
            "refused %s worker %s: it differs from %s in %s; a prefill and a decode worker must agree on %s, "
            "so it takes no requests",
            pool.name,
            worker.url,
            against,
            details,
            ", ".join(PAIRING_FIELDS),
        )

    # --- reporting ---------------------------------------------------------------------

    def status(self, pools: list[WorkerPool]) -> dict:
        """For /ready: the reference, and every healthy worker that takes no requests or
        was admitted unverified."""
        live = [(pool, w) for pool in pools for w in pool.workers if w.healthy]
        reference = {**(self.reference or {}), **self.expected} or None
        return {
            "reference": reference,
            "refused": [w.refusal for _, w in live if w.refusal is not None],
            "unverified": [
                {"pool": p.name, "worker": w.url}
                for p, w in live
                if w.admitted and w.info_read_at is not None and w.info is None
            ],
            "pending": [
                {"pool": p.name, "worker": w.url, "error": w.info_error or "not read yet"}
                for p, w in live
                if w.info_read_at is None
            ],
        }
