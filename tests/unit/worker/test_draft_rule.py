"""The K=0 rule on constructed requests."""

import pytest

from pdspec.worker.draft_rule import ScheduledRequest, can_use_drafts, dp_vote, propose_with_k0


def prefill(prompt: int, computed: int, scheduled: int, max_tokens: int = 64) -> ScheduledRequest:
    return ScheduledRequest(
        num_computed_tokens=computed,
        num_scheduled_tokens=scheduled,
        num_tokens=prompt,
        num_output_placeholders=0,
        num_output_tokens=0,
        max_tokens=max_tokens,
    )


def decode(prompt: int, outputs: int, max_tokens: int, k: int = 3, in_flight: int = 0) -> ScheduledRequest:
    """A decode step verifying k drafts; `in_flight` placeholder tokens under async scheduling."""
    return ScheduledRequest(
        num_computed_tokens=prompt + outputs - 1 + in_flight,
        num_scheduled_tokens=1 + k,
        num_tokens=prompt + outputs,
        num_output_placeholders=in_flight,
        num_output_tokens=outputs,
        max_tokens=max_tokens,
    )


def test_non_final_prefill_chunk_cannot_use_drafts():
    assert not can_use_drafts(prefill(prompt=2048, computed=0, scheduled=512))
    assert not can_use_drafts(prefill(prompt=2048, computed=1024, scheduled=1023))


def test_final_prefill_chunk_can_use_drafts():
    assert can_use_drafts(prefill(prompt=2048, computed=1536, scheduled=512))
    assert can_use_drafts(prefill(prompt=100, computed=0, scheduled=100))


@pytest.mark.parametrize("max_tokens, usable", [(1, False), (2, True), (3, True)])
def test_final_chunk_max_tokens_boundary(max_tokens, usable):
    # The final chunk samples output 1: with max_tokens 1 the request ends there.
    assert can_use_drafts(prefill(prompt=100, computed=0, scheduled=100, max_tokens=max_tokens)) is usable


@pytest.mark.parametrize("outputs, max_tokens, usable", [(5, 6, False), (5, 7, True), (9, 10, False), (0, 2, True)])
def test_decode_max_tokens_boundary_sync(outputs, max_tokens, usable):
    # After this step the request surely has outputs + 1 tokens (drafts may all be rejected).
    assert can_use_drafts(decode(prompt=10, outputs=outputs, max_tokens=max_tokens)) is usable


@pytest.mark.parametrize("outputs, max_tokens, usable", [(5, 7, False), (5, 8, True)])
def test_async_scheduling_counts_the_in_flight_step(outputs, max_tokens, usable):
    # One more step is in flight: its token is not known yet but will come.
    request = decode(prompt=10, outputs=outputs, max_tokens=max_tokens, in_flight=4)
    assert can_use_drafts(request) is usable


def test_mixed_batch_keeps_k_if_any_request_can_use_drafts():
    chunk = prefill(prompt=4096, computed=0, scheduled=512)
    finishing = decode(prompt=10, outputs=5, max_tokens=6)
    running = decode(prompt=10, outputs=5, max_tokens=64)
    assert propose_with_k0([chunk, finishing], "auto")
    assert not propose_with_k0([chunk, finishing, running], "auto")


def test_prefill_worker_steps_always_propose_k0():
    # P/D prefill leg: max_tokens=1, every chunk final or not.
    batch = [prefill(prompt=2048, computed=c, scheduled=512, max_tokens=1) for c in (0, 512, 1024, 1536)]
    assert propose_with_k0(batch, "auto")


def test_always_policy_never_skips_and_empty_step_does_not_count():
    assert not propose_with_k0([prefill(prompt=2048, computed=0, scheduled=512)], "always")
    assert not propose_with_k0([], "auto")


@pytest.mark.parametrize(
    "has_requests, skips, prefill_role, vote",
    [
        (False, False, True, True),  # idle prefill rank: votes skip, so busy ranks keep K=0
        (False, False, False, False),  # idle decode rank: keeps vLLM's vote (draft)
        (True, True, True, True),
        (True, False, True, False),  # a real request that can use drafts always wins
    ],
)
def test_dp_vote(has_requests, skips, prefill_role, vote):
    assert dp_vote(has_requests, skips, prefill_role) is vote
    # The ranks AND their votes: one busy prefill rank skipping plus one idle rank.
    assert all([dp_vote(True, True, True), dp_vote(False, False, True)])
