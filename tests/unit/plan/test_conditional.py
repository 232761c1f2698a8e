"""Conditional disaggregation in the fleet model (pdspec/plan/fleet_model.py, `Layout.conditional`):
each step of the rule checked where its answer can be worked out by hand from a synthetic
profile (tests/engine_profiles.py), and the engines that serve a layout with the rule against
the plain ones (differential: with every step of the rule off they give the same run)."""

import dataclasses

import pytest

from pdspec.plan import workload
from pdspec.plan.fleet_model import Conditional, Layout, simulate
from pdspec.plan.profile import ServingOverhead
from pdspec.plan.workload import Request
from tests.engine_profiles import synthetic

PROFILE = synthetic()
PREFILL, TRANSFER, DECODE3 = PROFILE.prefill.step_ms, PROFILE.transfer_ms, PROFILE.decode[3].step_ms
RULE = Conditional()
NO_RULE = Conditional(local_prefill_max_tokens=0, queue_rule=False, decode_full=False, load_tokens=0)


def with_rule(prefill: int, decode: int, rule: Conditional = RULE, **kwargs) -> Layout:
    return Layout.disaggregated(prefill, decode, conditional=rule, **kwargs)


def ms(seconds):
    return seconds * 1000


def test_a_short_prompt_is_served_whole_by_a_decode_engine_as_a_colocated_one_would():
    requests = [Request(arrival_s=t, isl=511, osl=6) for t in (0.0, 100.0)]  # fewer than 512 tokens
    run = simulate(PROFILE, with_rule(1, 1), 3, requests)
    colocated = simulate(PROFILE, Layout.aggregated(1), 3, requests)
    assert run.routes == {"short_prompt": 2}
    assert [(o.ttft_s, o.tpot_s) for o in run.outcomes] == [(o.ttft_s, o.tpot_s) for o in colocated.outcomes]
    assert run.steps["prefill"] == []  # the prefill engine never stepped


def test_a_prompt_of_exactly_the_bound_is_not_short_and_zero_turns_local_prefills_off():
    # The proxy's rule: a decode worker prefills a prompt it lacks fewer than the bound of.
    assert simulate(PROFILE, with_rule(1, 1), 3, [Request(0.0, isl=512, osl=6)]).routes == {"disaggregated": 1}
    # 0: never prefill on a decode worker, the queue rule included (this pair would trip it).
    requests = [Request(arrival_s=0.0, isl=1024, osl=6), Request(arrival_s=0.001, isl=100, osl=6)]
    off = dataclasses.replace(RULE, local_prefill_max_tokens=0)
    assert simulate(PROFILE, with_rule(1, 1, off), 3, requests).routes == {"disaggregated": 2}


def test_requests_served_whole_get_the_aggregated_serving_term():
    serving = ServingOverhead(disaggregated_ms=40.0, aggregated_ms=15.0, source="a unit test")
    profile = PROFILE.model_copy(update={"serving_ms": serving})
    requests = [Request(arrival_s=0.0, isl=100, osl=6), Request(arrival_s=100.0, isl=1024, osl=6)]
    bare, served = (simulate(p, with_rule(1, 1), 3, requests) for p in (PROFILE, profile))
    assert bare.routes == {"short_prompt": 1, "disaggregated": 1}
    terms = [ms(with_term.ttft_s - without.ttft_s) for without, with_term in zip(bare.outcomes, served.outcomes)]
    assert terms == pytest.approx([15.0, 40.0])


def test_a_leg_does_not_go_to_a_prefill_engine_busy_decoding_whole_requests():
    # A decode engine counted full at half its KV: the first prompt (6,000 tokens) goes whole to
    # prefill engine 0 (a tie on room), which still decodes it when the second (1,000 tokens)
    # comes; that one's leg goes to idle engine 1, engine 0's whole request counting as a leg in
    # flight (as kv_aware's load counts it), not to engine 0 whose prompt tokens are all computed.
    profile = synthetic(kv_tokens=10_000)
    rule = dataclasses.replace(RULE, queue_rule=False, decode_full_share=0.5)
    requests = [Request(arrival_s=0.0, isl=6000, osl=200), Request(arrival_s=0.5, isl=1000, osl=6)]
    run = simulate(profile, with_rule(2, 1, rule), 3, requests)
    assert run.routes == {"decode_full": 1, "disaggregated": 1}
    first, second = run.outcomes
    assert second.request.arrival_s < first.end_s  # engine 0 was still decoding
    # One prefill step of its own on an idle engine, then the hand-off and a decode step alone.
    assert ms(second.ttft_s) == pytest.approx(PREFILL.at(1000) + TRANSFER.at(1000) + DECODE3.at(1))


def test_a_long_prompt_on_an_idle_fleet_is_disaggregated_as_without_the_rule():
    requests = [Request(arrival_s=t, isl=1024, osl=6) for t in (0.0, 100.0)]
    run = simulate(PROFILE, with_rule(1, 1), 3, requests)
    assert run.routes == {"disaggregated": 2}
    for outcome in run.outcomes:
        assert ms(outcome.ttft_s) == pytest.approx(PREFILL.at(1024) + TRANSFER.at(1024) + DECODE3.at(1))


@pytest.mark.parametrize(
    "layout",
    [
        Layout.disaggregated(1, 1),
        Layout.disaggregated(2, 3),
        Layout.disaggregated(3, 1, devices=1),  # sharing a device: the steps' kinds must match too
    ],
    ids=str,
)
def test_with_every_step_of_the_rule_off_the_run_is_the_plain_layouts(layout):
    profile = PROFILE.with_sharing(1.5, "a unit test", "prefill")
    requests = workload.poisson(12.0, 150, [(1024, 32), (3000, 8), (200, 64)], seed=3)
    plain = simulate(profile, layout, 3, requests)
    ruled = simulate(profile, dataclasses.replace(layout, conditional=NO_RULE), 3, requests)
    assert ruled.routes == {"disaggregated": 150}
    assert [(o.first_token_s, o.end_s) for o in ruled.outcomes] == [(o.first_token_s, o.end_s) for o in plain.outcomes]
    assert ruled.steps == plain.steps


def full_decode_profile(requests_held: int):
    """A decode engine's KV holds `requests_held` requests of 1,024 + 8 tokens (the engines'
    reservation) and, by the rule's count of prompt tokens, as many prompts."""
    return synthetic(kv_tokens=requests_held * (1024 + 8))


def test_decode_full_serves_whole_on_a_prefill_engine_what_the_decode_pool_has_no_room_for():
    # Three requests at once; each engine's KV holds one. The first is disaggregated (a leg on
    # prefill engine 0); by the pending count the second finds the decode pool's room planned
    # away and goes whole to the prefill engine with the most room (engine 1, engine 0's room
    # leased by the leg); the third finds no prefill engine with room and is disaggregated.
    profile = full_decode_profile(1)
    requests = [Request(arrival_s=0.0, isl=1024, osl=8) for _ in range(3)]
    run = simulate(profile, with_rule(2, 1, dataclasses.replace(RULE, queue_rule=False)), 3, requests)
    assert run.routes == {"disaggregated": 2, "decode_full": 1}
    first, second, _ = run.outcomes
    # A whole request's first token comes from its prefill step, with no hand-off.
    assert ms(second.ttft_s) == pytest.approx(PREFILL.at(1024))
    assert ms(first.ttft_s) == pytest.approx(PREFILL.at(1024) + TRANSFER.at(1024) + DECODE3.at(1))


def test_without_the_pending_count_a_burst_is_planned_on_the_room_of_before_it():
    profile = full_decode_profile(1)
    requests = [Request(arrival_s=0.0, isl=1024, osl=8) for _ in range(3)]
    rule = dataclasses.replace(RULE, queue_rule=False, counts_pending=False)
    run = simulate(profile, with_rule(2, 1, rule), 3, requests)
    # Nothing is on the decode engine until the first hand-off: all three are disaggregated and
    # two wait there for its KV.
    assert run.routes == {"disaggregated": 3}
    assert max(o.ttft_s for o in run.outcomes) > 2 * min(o.ttft_s for o in run.outcomes)


def test_decode_full_needs_room_on_a_prefill_engine():
    profile = full_decode_profile(1)
    requests = [Request(arrival_s=0.0, isl=1024, osl=8) for _ in range(2)]
    # A prefill engine may fill a tenth of its KV with whole requests: not one 1,024-token prompt.
    rule = dataclasses.replace(RULE, queue_rule=False, decode_full_prefill_share=0.1)
    assert simulate(profile, with_rule(1, 1, rule), 3, requests).routes == {"disaggregated": 2}


def test_the_queue_rule_prefills_on_the_decode_engine_behind_a_busy_prefill_pool():
    # The second long prompt arrives while the first is in its prefill step: the pool's work
    # ahead (1,024 + 1,024 + one leg and the hand-off at 256 each) exceeds the decode engine's
    # (1,024) by more than 512.
    requests = [Request(arrival_s=0.0, isl=1024, osl=6), Request(arrival_s=0.001, isl=1024, osl=6)]
    run = simulate(PROFILE, with_rule(1, 1), 3, requests)
    assert run.routes == {"disaggregated": 1, "prefill_queue": 1}
    off = simulate(PROFILE, with_rule(1, 1, dataclasses.replace(RULE, queue_rule=False)), 3, requests)
    assert off.routes == {"disaggregated": 2}
    # On the idle decode engine the second starts its prefill at once, not behind the first.
    assert run.outcomes[1].first_token_s < off.outcomes[1].first_token_s


def test_every_request_finishes_under_load_and_whole_requests_take_kv_on_the_prefill_engines():
    profile = synthetic(kv_tokens=6 * (4096 + 48))
    requests = workload.poisson(8.0, 300, [(4096, 48), (300, 48)], seed=5)
    run = simulate(profile, with_rule(3, 1), 3, requests)
    assert sum(run.routes.values()) == 300 and set(run.routes) >= {"disaggregated", "decode_full", "short_prompt"}
    assert all(o.end_s >= o.first_token_s >= o.request.arrival_s for o in run.outcomes)


def test_an_aggregated_layout_takes_no_rule():
    with pytest.raises(ValueError, match="needs a disaggregated layout"):
        Layout(colocated=2, conditional=RULE)
    assert str(with_rule(3, 1)) == "3P:1D conditional"
