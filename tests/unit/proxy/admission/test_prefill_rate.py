"""A prefill worker's rate as the proxy measures it from its legs (proxy/admission/prefill_rate.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.admission.prefill_rate import PrefillRate


def test_no_rate_until_a_leg_is_answered():
    rate = PrefillRate()
    assert rate.tokens_per_s is None and rate.queued_s(1000) is None
    rate.started(0.0)
    rate.ended(0.5, None)  # failed: busy time, no tokens
    assert rate.tokens_per_s is None


def test_the_first_answered_leg_gives_the_rate_at_once():
    rate = PrefillRate()
    rate.started(10.0)
    rate.ended(10.5, 4000)
    assert rate.tokens_per_s == 8000 and rate.queued_s(16_000) == 2.0


def test_overlapping_legs_count_the_busy_time_once():
    """Two legs in flight together for 1 s answer 2,000 tokens: 2,000 a second, not 1,000."""
    rate = PrefillRate()
    rate.started(0.0)
    rate.ended(0.1, 100)  # the first sample: 1,000 tok/s
    rate.started(1.0)
    rate.started(1.0)
    rate.ended(1.5, 1000)
    rate.ended(2.0, 1000)  # 1 s busy, 2,000 tokens: a sample of 2,000
    assert rate.tokens_per_s == 1000 + PrefillRate.WEIGHT * (2000 - 1000)


def test_idle_time_between_bursts_does_not_lower_the_rate():
    rate = PrefillRate()
    rate.started(0.0)
    rate.ended(1.0, 5000)
    rate.started(100.0)  # 99 s idle
    rate.ended(101.0, 5000)
    assert rate.tokens_per_s == 5000


def test_a_worker_whose_legs_fail_reads_as_slower():
    rate = PrefillRate()
    rate.started(0.0)
    rate.ended(1.0, 5000)
    rate.started(1.0)
    rate.ended(3.0, None)  # timed out after 2 s
    rate.started(3.0)
    rate.ended(3.5, 2500)  # a window of 2.5 s busy and 2,500 tokens: 1,000 a second
    assert rate.tokens_per_s == 5000 + PrefillRate.WEIGHT * (1000 - 5000)


def test_an_end_without_a_start_is_ignored():
    rate = PrefillRate()
    rate.ended(1.0, 100)
    assert rate.tokens_per_s is None and rate.legs_in_flight == 0


@given(st.lists(st.tuples(st.floats(0.01, 5.0), st.integers(1, 50_000), st.booleans()), min_size=1, max_size=40))
def test_the_rate_stays_within_the_samples_it_averaged(legs):
    """One leg at a time: whatever the mix, the rate lies between the slowest and the fastest
    window's tokens per busy second, and never goes negative or infinite."""
    rate, now = PrefillRate(), 0.0
    busy, tokens, samples = 0.0, 0, []
    for seconds, count, answered in legs:
        rate.started(now)
        now += seconds
        rate.ended(now, count if answered else None)
        busy, tokens = busy + seconds, tokens + (count if answered else 0)
        if tokens and (len(samples) == 0 or busy >= PrefillRate.WINDOW_S):
            samples.append(tokens / busy)
            busy, tokens = 0.0, 0
    if not samples:
        assert rate.tokens_per_s is None
    else:
        assert min(samples) * (1 - 1e-9) <= rate.tokens_per_s <= max(samples) * (1 + 1e-9)
