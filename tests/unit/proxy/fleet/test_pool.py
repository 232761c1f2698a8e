"""Pools, health ejection and re-admission (pure logic); the policies are tested in
tests/unit/proxy/routing/policies/."""

import pytest

from proxy.fleet.health import HealthChecker
from proxy.fleet.pool import NoHealthyWorker, WorkerPool
from proxy.routing import registry


def pool(policy, n=4):
    return WorkerPool.from_urls("prefill", [f"http://10.0.0.{i}:8100" for i in range(n)], registry.make(policy))


def test_unhealthy_and_excluded_workers_are_skipped():
    p = pool("round_robin", 2)
    p.workers[0].healthy = False
    assert {p.pick().url for _ in range(4)} == {p.workers[1].url}
    with pytest.raises(NoHealthyWorker):
        p.pick(exclude={p.workers[1].url})


def test_membership_change_keeps_known_workers_state():
    p = pool("round_robin", 2)
    p.workers[0].outstanding = 3
    p.set_urls([p.workers[0].url, "http://10.0.0.9:8100"])
    assert p.workers[0].outstanding == 3 and p.workers[1].url.endswith("9:8100")
    # A new member takes no traffic before its first good health check, then at once.
    assert not p.workers[1].healthy
    checker = HealthChecker(None, [p], interval_s=1, timeout_s=1, eject_after=2, readmit_after=3)
    checker.record(p, p.workers[1], ok=True)
    assert p.workers[1].healthy


def test_ejection_after_failures_and_readmission_after_successes():
    p = pool("round_robin", 1)
    checker = HealthChecker(None, [p], interval_s=1, timeout_s=1, eject_after=2, readmit_after=2)
    worker = p.workers[0]
    checker.record(p, worker, ok=False)
    assert worker.healthy  # one failed check is not enough
    checker.record(p, worker, ok=False)
    assert not worker.healthy
    checker.record(p, worker, ok=True)
    assert not worker.healthy
    checker.record(p, worker, ok=True)
    assert worker.healthy


def test_a_lease_holds_its_kv_tokens_until_released_and_its_computed_tokens_until_prefilled():
    """A request served whole on a prefill worker (decode_full) holds its prompt in the
    worker's KV for the whole leg (`kv_held_tokens`), but is prefill work there (kv_aware's
    `pending_tokens`, and churn) only until its first token: then it decodes."""
    worker = pool("least_outstanding", 1).workers[0]
    prefill_leg = worker.lease(1000, held=4096)  # a prefill leg: uncached tokens, its whole prompt held
    whole = worker.lease(computed=False, held=4096, computing=3000)
    assert (worker.outstanding, worker.pending_tokens, worker.kv_held_tokens) == (2, 4000, 8192)
    assert worker.churn.value() == pytest.approx(4000, rel=1e-3)
    whole.prefilled()
    whole.prefilled()  # idempotent
    assert (worker.outstanding, worker.pending_tokens, worker.kv_held_tokens) == (2, 1000, 8192)
    whole.release()
    whole.release()
    assert (worker.outstanding, worker.pending_tokens, worker.kv_held_tokens) == (1, 1000, 4096)
    prefill_leg.release()
    assert (worker.outstanding, worker.pending_tokens, worker.kv_held_tokens, worker.local_prefill_tokens) == (
        0,
        0,
        0,
        0,
    )


def test_a_pending_decode_lease_counts_its_tokens_on_the_pool_until_released_once():
    """Conditional disaggregation's pending decode KV: each disaggregated request's prompt
    from its plan until its decode leg leases a worker's KV; the flow releases it there and
    again when the request ends, so a second release must give nothing back."""
    decode = pool("least_outstanding", 2)
    first, second = decode.pend_decode(4096), decode.pend_decode(1000)
    assert decode.decode_pending_tokens == 5096
    assert all(w.kv_held_tokens == 0 and w.outstanding == 0 for w in decode.workers)  # no worker's count
    first.release()
    first.release()
    assert decode.decode_pending_tokens == 1000
    with second:
        pass
    second.release()
    assert decode.decode_pending_tokens == 0
