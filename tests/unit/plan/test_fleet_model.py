"""The fleet model (pdspec/plan/fleet_model.py): each assumption its docstring states, checked
where the answer can be worked out by hand from a synthetic profile (tests/engine_profiles.py:
made-up curves, no measured profile), and the run as a whole: every request finishes, the
same seed gives the same run, TTFT grows with the rate."""

import pytest

from pdspec.plan import workload
from pdspec.plan.fleet_model import FleetRun, Layout, Outcome, Slo, percentiles, simulate
from pdspec.plan.profile import ServingOverhead
from pdspec.plan.workload import Request
from tests.engine_profiles import synthetic

PROFILE = synthetic()
PREFILL, TRANSFER = PROFILE.prefill.step_ms, PROFILE.transfer_ms
DECODE0, DECODE3 = PROFILE.decode[0].step_ms, PROFILE.decode[3].step_ms
ONE_P_ONE_D = Layout.disaggregated(1, 1)


def ms(seconds):
    return seconds * 1000


def ms_to_s(milliseconds):
    return milliseconds / 1000


def test_alone_a_request_waits_one_prefill_step_its_hand_off_and_one_decode_step():
    requests = [Request(arrival_s=t, isl=1024, osl=6) for t in (0.0, 100.0, 200.0)]  # never overlapping
    run = simulate(PROFILE, ONE_P_ONE_D, 3, requests)
    for outcome in run.outcomes:
        assert ms(outcome.ttft_s) == pytest.approx(PREFILL.at(1024) + TRANSFER.at(1024) + DECODE3.at(1))
        # 6 tokens at 2.5 a step: 3 steps, the first of which brings the first token.
        assert ms(outcome.tpot_s) == pytest.approx(2 * DECODE3.at(1) / 5)


def test_alone_on_a_colocated_engine_a_request_waits_its_prefill_step_only():
    requests = [Request(arrival_s=t, isl=1024, osl=6) for t in (0.0, 100.0)]
    run = simulate(PROFILE, Layout.aggregated(1), 3, requests)
    for outcome in run.outcomes:
        assert ms(outcome.ttft_s) == pytest.approx(PREFILL.at(1024))  # no hand-off, first token from the prefill
        assert ms(outcome.tpot_s) == pytest.approx(2 * DECODE3.at(1) / 5)  # 5 more tokens at 2.5 a step


@pytest.mark.parametrize(("layout", "term"), [(ONE_P_ONE_D, 40.0), (Layout.aggregated(1), 15.0)])
def test_the_serving_term_of_the_layouts_kind_shifts_ttft_and_leaves_tpot(layout, term):
    serving = ServingOverhead(disaggregated_ms=40.0, aggregated_ms=15.0, source="a unit test")
    requests = workload.poisson(20.0, 60, [(1024, 6)], seed=1)
    bare = simulate(PROFILE, layout, 3, requests)
    served = simulate(PROFILE.model_copy(update={"serving_ms": serving}), layout, 3, requests)
    for without, with_term in zip(bare.outcomes, served.outcomes):
        assert ms(with_term.ttft_s) == pytest.approx(ms(without.ttft_s) + term)
        assert with_term.tpot_s == pytest.approx(without.tpot_s)


def test_a_long_prompt_is_chunked_over_full_steps():
    (outcome,) = simulate(PROFILE, ONE_P_ONE_D, 0, [Request(0.0, isl=5120, osl=1)]).outcomes
    steps = 2 * PREFILL.at(2048) + PREFILL.at(1024)
    assert ms(outcome.ttft_s) == pytest.approx(steps + TRANSFER.at(5120) + DECODE0.at(1))
    assert outcome.tpot_s is None  # one output token: no TPOT


def test_short_prompts_share_a_step_on_the_prefill_engine_with_the_fewest_prompt_tokens():
    long, medium = Request(0.0, isl=3 * 2048, osl=1), Request(0.0, isl=500, osl=1)
    short = Request(0.001, isl=100, osl=1)  # arrives while the medium prompt's step runs
    run = simulate(PROFILE, Layout.disaggregated(2, 1), 0, [long, medium, short, short])
    # The long prompt takes the first engine, the medium one the second; both short ones go
    # to the second (500 outstanding tokens against 6,144) and share its next step, then
    # decode together in one step of two.
    first_short, second_short = run.outcomes[2], run.outcomes[3]
    steps = PREFILL.at(500) + PREFILL.at(200)
    assert ms(first_short.ttft_s) == pytest.approx(steps - 1 + TRANSFER.at(100) + DECODE0.at(2))
    assert second_short.ttft_s == pytest.approx(first_short.ttft_s)


def test_a_colocated_step_pays_the_fixed_cost_once_and_a_prompt_joins_at_the_next_step():
    resident, newcomer = Request(0.0, isl=100, osl=1000), Request(1.0, isl=500, osl=2)
    run = simulate(PROFILE, Layout.aggregated(1), 0, [resident, newcomer])
    # The resident decodes alone in steps of DECODE0.at(1) after its prefill step; the
    # newcomer's prompt rides the first step that starts after it arrives.
    boundary = PREFILL.at(100)
    while boundary < 1000:
        boundary += DECODE0.at(1)
    mixed_step = DECODE0.at(1) + PREFILL.at(500) - PREFILL.intercept()
    outcome = run.outcomes[1]
    assert ms(outcome.first_token_s) == pytest.approx(boundary + mixed_step)
    assert ms(outcome.tpot_s) == pytest.approx(DECODE0.at(2))  # its one more token, in a batch of two


def test_each_decoding_request_takes_its_token_and_its_drafts_from_a_colocated_steps_budget():
    # A budget of 64 tokens and 16 requests decoding with K=3: 16 * (1 + 3) = 64, nothing left to prefill.
    profile = synthetic(prefill=[(1, 5.0), (64, 10.0)], budget=64)
    requests = [Request(0.0, isl=4, osl=1000) for _ in range(16)] + [Request(0.5, isl=4, osl=2)]
    run = simulate(profile, Layout.aggregated(1), 3, requests)
    assert run.outcomes[16].first_token_s >= run.outcomes[0].end_s


def test_kv_room_holds_requests_back_until_others_end():
    # Room for two requests' ISL + OSL: the third joins at the step boundary where the first
    # ends (its first token one step of two later), the fourth where the second ends.
    profile = synthetic(kv_tokens=2 * (100 + 10))
    run = simulate(profile, ONE_P_ONE_D, 0, [Request(0.0, isl=100, osl=10) for _ in range(4)])
    first, second, third, fourth = run.outcomes
    assert third.first_token_s == pytest.approx(first.end_s + DECODE0.at(2) / 1000)
    assert second.end_s < fourth.first_token_s == pytest.approx(second.end_s + DECODE0.at(2) / 1000)


def test_max_num_seqs_caps_the_batch():
    run = simulate(PROFILE, ONE_P_ONE_D, 0, [Request(0.0, isl=100, osl=10) for _ in range(3)], max_num_seqs=1)
    ends = [outcome.end_s for outcome in run.outcomes]
    starts = [outcome.first_token_s for outcome in run.outcomes]
    assert starts[1] > ends[0] and starts[2] > ends[1]


def test_a_request_bigger_than_the_kv_runs_alone_and_ends():
    run = simulate(synthetic(kv_tokens=100), ONE_P_ONE_D, 0, [Request(0.0, isl=200, osl=10)] * 2)
    assert run.outcomes[1].first_token_s > run.outcomes[0].end_s


@pytest.mark.parametrize("layout", [ONE_P_ONE_D, Layout.disaggregated(2, 3), Layout.aggregated(2)], ids=str)
def test_every_request_finishes_even_far_past_capacity(layout):
    requests = workload.poisson(500.0, 300, [(512, 64), (2048, 16), (64, 1)], seed=3)
    run = simulate(synthetic(kv_tokens=20_000), layout, 3, requests)
    assert len(run.outcomes) == len(requests)
    assert [o.request for o in run.outcomes] == sorted(requests, key=lambda r: r.arrival_s)
    assert all(o.request.arrival_s < o.first_token_s <= o.end_s for o in run.outcomes)


def test_ttft_p90_grows_with_the_rate():
    slo = Slo(ttft_p90_ms=1000, tpot_p90_ms=100)
    p90s = []
    for rate in (1.0, 10.0, 20.0, 30.0):
        run = simulate(PROFILE, ONE_P_ONE_D, 3, workload.poisson(rate, 300, [(1024, 128)], seed=0))
        p90s.append(run.summary(slo).ttft_ms.p90)
    assert p90s == sorted(p90s) and p90s[-1] > 2 * p90s[0]


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    def run(seed):
        return simulate(PROFILE, Layout.disaggregated(2, 2), 3, workload.poisson(20.0, 200, [(1024, 128)], seed))

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_a_summary_counts_latency_goodput_and_utilization_over_the_measured_requests():
    outcomes = [
        Outcome(Request(0.0, 10, 10), first_token_s=0.1, end_s=1.0),
        Outcome(Request(1.0, 10, 10), first_token_s=1.5, end_s=2.0),  # TTFT 500 ms: over the SLO
        Outcome(Request(2.0, 10, 10), first_token_s=2.1, end_s=3.0),
        Outcome(Request(3.0, 10, 10), first_token_s=3.1, end_s=4.0),
    ]
    run = FleetRun(outcomes=outcomes, steps={"decode": [(0.0, 2.0), (3.0, 5.0)]}, engines={"decode": 1})
    slo = Slo(ttft_p90_ms=200, tpot_p90_ms=150)
    whole = run.summary(slo)
    assert (whole.count, whole.duration_s, whole.throughput_rps) == (4, 4.0, 1.0)
    assert (whole.attainment, whole.goodput_rps) == (0.75, 0.75)
    assert whole.utilization == {"decode": pytest.approx(3 / 4)}  # 2 s + 1 s of steps in [0, 4]
    assert whole.ttft_ms.p50 == pytest.approx(100) and whole.tpot_ms.p90 == pytest.approx(100)
    middle = run.summary(slo, slice(1, 3))  # [1, 3]: one second of steps
    assert (middle.count, middle.attainment, middle.utilization) == (2, 0.5, {"decode": pytest.approx(0.5)})
    with pytest.raises(ValueError):
        run.summary(slo, slice(4, None))


def test_percentiles_interpolate_between_ranks():
    assert percentiles(range(1, 102)) == percentiles([float(v) for v in range(101, 0, -1)])
    assert (percentiles(range(1, 102)).p50, percentiles(range(1, 102)).p90) == (51, 91)
    assert percentiles([]).p99 == 0.0


def test_one_output_token_has_no_tpot_and_the_summary_reads_zero():
    run = simulate(PROFILE, ONE_P_ONE_D, 0, [Request(0.0, isl=100, osl=1)])
    assert run.summary(Slo(1000, 1)).tpot_ms.p90 == 0.0 and run.summary(Slo(1000, 1)).attainment == 1.0


@pytest.mark.parametrize(
    "counts", [{"prefill": 1}, {}, {"prefill": 1, "decode": 1, "colocated": 1}, {"decode": 2}], ids=str
)
def test_a_layout_is_one_kind_or_the_other(counts):
    with pytest.raises(ValueError):
        Layout(**counts)


def test_a_draft_length_the_profile_did_not_measure_is_refused():
    with pytest.raises(ValueError, match="K=5"):
        simulate(PROFILE, ONE_P_ONE_D, 5, [Request(0.0, 10, 10)])


# Devices: the steps on a shared one slow each other by 1 + alpha * (m - 1); alone, an engine runs as before.

MIXED = [(512, 64), (2048, 16), (64, 1)]


@pytest.mark.parametrize(
    ("layout", "figures"),
    [
        # What the model gave before devices were modelled (commit 722f1f8), to the last digit.
        (Layout.disaggregated(2, 2, devices=4), (37.16626094627432, 109.98105732216872, 5.9103267973856175)),
        (Layout.aggregated(3, devices=3), (37.251166139669124, 125.79363422777254, 9.945656792900825)),
    ],
    ids=str,
)
def test_one_engine_per_device_gives_the_figures_of_the_model_without_devices(layout, figures):
    assert layout == Layout(layout.prefill, layout.decode, layout.colocated) and not layout.shares_devices
    run = simulate(synthetic(kv_tokens=20_000), layout, 3, workload.poisson(40.0, 300, MIXED, seed=0))
    summary = run.summary(Slo(500, 50))
    assert (summary.throughput_rps, summary.ttft_ms.p90, summary.tpot_ms.p90) == pytest.approx(figures, rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.35, 1.0, 3.0])
@pytest.mark.parametrize(
    ("layout", "figures"),
    [
        (Layout.disaggregated(2, 2, devices=4), (37.16626094627432, 109.98105732216872, 5.9103267973856175)),
        (Layout.aggregated(3, devices=3), (37.251166139669124, 125.79363422777254, 9.945656792900825)),
    ],
    ids=str,
)
def test_an_engine_alone_on_its_device_runs_as_before_whatever_alpha(layout, figures, alpha):
    # The figures of the test above: no device is shared, so alpha has nothing to act on.
    profile = synthetic(kv_tokens=20_000).with_sharing(alpha, "a unit test")
    run = simulate(profile, layout, 3, workload.poisson(40.0, 300, MIXED, seed=0))
    summary = run.summary(Slo(500, 50))
    assert (summary.throughput_rps, summary.ttft_ms.p90, summary.tpot_ms.p90) == pytest.approx(figures, rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0])
def test_two_engines_in_lockstep_on_one_device_each_step_lasts_its_time_times_one_plus_alpha(alpha):
    # Two alike requests at once go to the two colocated engines, whose steps then start and
    # end together: every step shares the device with exactly one other throughout.
    profile = PROFILE.with_sharing(alpha, "a unit test")
    requests = [Request(0.0, isl=1024, osl=6), Request(0.0, isl=1024, osl=6)]
    run = simulate(profile, Layout.aggregated(2, devices=1), 0, requests)
    stretch = 1 + alpha
    for outcome in run.outcomes:
        assert ms(outcome.ttft_s) == pytest.approx(PREFILL.at(1024) * stretch, rel=1e-9)
        assert ms(outcome.tpot_s) == pytest.approx(DECODE0.at(1) * stretch, rel=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0])
def test_a_step_is_stretched_only_while_another_runs_beside_it(alpha):
    resident = Request(0.0, isl=1024, osl=1000)  # decodes throughout the newcomer's prompt
    prefill, transfer, decode = PREFILL.at(1024), TRANSFER.at(1024), DECODE0.at(1)
    newcomer = Request(ms_to_s(prefill + transfer + decode / 2), isl=1024, osl=1)  # mid first decode step
    profile = PROFILE.with_sharing(alpha, "a unit test")
    shared = simulate(profile, Layout.disaggregated(1, 1, devices=1), 0, [resident, newcomer])
    # The resident's prompt ran alone: its profiled time. The newcomer's starts on arrival and
    # shares the device throughout; the decode step under way ran its first half alone and
    # its second half beside the newcomer's prompt.
    assert shared.steps["prefill"][0] == pytest.approx((0.0, ms_to_s(prefill)))
    assert shared.steps["prefill"][1] == pytest.approx(
        (newcomer.arrival_s, newcomer.arrival_s + ms_to_s(prefill * (1 + alpha)))
    )
    assert shared.steps["decode"][0][1] == pytest.approx(newcomer.arrival_s + ms_to_s(decode / 2 * (1 + alpha)))


# What the model gave with turn-taking (a device ran one step at a time, commit a32cc0d), for
# alike colocated engines: throughput and TPOT p50 of 300 requests.
TURN_TAKING = [
    (Layout.aggregated(3, devices=1), 40.0, (28.518167067497753, 62.52551181102358)),
    (Layout.aggregated(3, devices=1), 500.0, (29.68878707179296, 63.19037693817686)),
    (Layout.aggregated(4, devices=2), 40.0, (35.495393722365435, 19.95523750707632)),
    (Layout.aggregated(4, devices=2), 500.0, (55.26808002447835, 40.20182244376317)),
]


@pytest.mark.parametrize(("layout", "rate", "figures"), TURN_TAKING, ids=str)
def test_alpha_one_gives_the_turn_takings_figures_for_alike_engines(layout, rate, figures):
    # Both give the device one engine's throughput, so throughput agrees to the drain's edge
    # (within 2%); they differ in the order of service (a short step ends beside a long one
    # here, waited for it there), which moved TPOT p50 by up to 6% here, held to 10%. Not for
    # prefill and decode engines sharing a device: there the turns let a decode batch grow
    # while it waited, and processor sharing does not (docs/planning.md).
    profile = synthetic(kv_tokens=20_000).with_sharing(1.0, "a unit test")
    summary = simulate(profile, layout, 3, workload.poisson(rate, 300, MIXED, seed=0)).summary(Slo(500, 50))
    throughput, tpot_p50 = figures
    assert summary.throughput_rps == pytest.approx(throughput, rel=0.02)
    assert summary.tpot_ms.p50 == pytest.approx(tpot_p50, rel=0.10)


def test_without_a_sharing_term_a_profile_shares_a_device_with_alpha_one():
    requests = workload.poisson(40.0, 200, MIXED, seed=2)
    layout = Layout.aggregated(3, devices=1)
    default = simulate(synthetic(kv_tokens=20_000), layout, 3, requests).summary(Slo(500, 50))
    one = simulate(synthetic(kv_tokens=20_000).with_sharing(1.0, "a unit test"), layout, 3, requests)
    two = simulate(synthetic(kv_tokens=20_000).with_sharing(2.0, "a unit test"), layout, 3, requests)
    assert default == one.summary(Slo(500, 50)) != two.summary(Slo(500, 50))


@pytest.mark.parametrize("layout", [Layout.disaggregated(2, 2, devices=1), Layout.aggregated(3, devices=1)], ids=str)
def test_tpot_on_a_shared_device_grows_with_alpha(layout):
    requests = workload.poisson(20.0, 300, MIXED, seed=1)

    def tpot_p50(alpha):
        profile = synthetic(kv_tokens=20_000).with_sharing(alpha, "a unit test")
        return simulate(profile, layout, 3, requests).summary(Slo(500, 50)).tpot_ms.p50

    assert tpot_p50(0.0) < tpot_p50(0.5) < tpot_p50(1.0) < tpot_p50(2.0)


def test_at_alpha_zero_shared_engines_run_as_if_each_had_a_device():
    requests = workload.poisson(20.0, 300, MIXED, seed=1)
    no_slo = Slo(ttft_p90_ms=float("inf"), tpot_p90_ms=float("inf"))
    free = synthetic(kv_tokens=20_000).with_sharing(0.0, "a unit test")
    shared = simulate(free, Layout.aggregated(3, devices=1), 3, requests).summary(no_slo)
    alone = simulate(free, Layout.aggregated(3), 3, requests).summary(no_slo)
    # Not to the last digit: the device's events can order same-instant events otherwise.
    assert (shared.throughput_rps, shared.ttft_ms.p90, shared.tpot_ms.p90) == pytest.approx(
        (alone.throughput_rps, alone.ttft_ms.p90, alone.tpot_ms.p90), rel=1e-6
    )


def test_sharing_devices_costs_throughput_past_capacity():
    requests = workload.poisson(500.0, 300, MIXED, seed=3)

    def throughput(devices):
        run = simulate(synthetic(kv_tokens=20_000), Layout.disaggregated(2, 2, devices=devices), 3, requests)
        return run.summary(Slo(500, 50)).throughput_rps

    assert throughput(1) < throughput(2) < throughput(4)


def test_engines_go_on_the_devices_round_robin_prefill_first():
    assert Layout.disaggregated(2, 2, devices=2).placement == (0, 1, 0, 1)
    assert Layout.disaggregated(2, 1, devices=2).placement == (0, 1, 0)
    assert Layout.aggregated(3, devices=1).placement == (0, 0, 0)
    assert (str(Layout.disaggregated(2, 2, devices=1)), str(Layout.aggregated(3, devices=2))) == (
        "2P:2D on 1 device",
        "aggregated x3 on 2 devices",
    )
    assert str(Layout.disaggregated(2, 2, devices=4)) == "2P:2D"


@pytest.mark.parametrize("devices", [0, 5, -1])
def test_a_layout_needs_one_to_as_many_devices_as_engines(devices):
    with pytest.raises(ValueError, match="devices"):
        Layout.disaggregated(2, 2, devices=devices)


def test_an_explicit_placement_puts_each_engine_where_it_says_and_sets_the_devices():
    by_role = Layout.disaggregated(2, 2, device_of=(0, 0, 1, 1))  # pdspec's CPU stack: prefill on core 0
    assert by_role.placement == (0, 0, 1, 1) and by_role.devices == 2 and by_role.shares_devices
    assert Layout.disaggregated(2, 1, devices=2, device_of=(0, 0, 1)).devices == 2


@pytest.mark.parametrize(
    "device_of, devices",
    [((0, 0, 1), None), ((0, 0, 2, 2), None), ((1, 1, 1, 1), None), ((0, 0, 1, 1), 3)],
)
def test_a_placement_must_name_every_engines_device_from_zero_with_none_skipped(device_of, devices):
    with pytest.raises(ValueError, match="device"):
        Layout.disaggregated(2, 2, devices=devices, device_of=device_of)


def test_a_placement_by_role_puts_the_prefill_work_on_one_device():
    # Both prefill engines on device 0 share it at every prompt, the decode engines share
    # device 1 with each other only; round robin spreads each role over both devices. (With
    # turn-taking, TPOT was also no worse by role, a decode step never waiting behind a
    # prompt's; processor sharing slows a decode step as much beside either, so that no longer holds.)
    prefill_bound = synthetic(prefill=[(16, 5.0), (512, 40.0)], decode={0: ([(1, 2.0), (64, 4.0)], 1.0)})
    arrivals = workload.poisson(30.0, 200, [(512, 8)], seed=1)
    no_slo = Slo(ttft_p90_ms=float("inf"), tpot_p90_ms=float("inf"))
    by_role = simulate(prefill_bound, Layout.disaggregated(2, 2, device_of=(0, 0, 1, 1)), 0, arrivals).summary(no_slo)
    spread = simulate(prefill_bound, Layout.disaggregated(2, 2, devices=2), 0, arrivals).summary(no_slo)
    assert by_role.ttft_ms.p50 > spread.ttft_ms.p50


def test_arrivals_at_one_instant_after_others_run_in_order():
    # 0.3 + (0.9 - 0.3) is not 0.9 in floats: the second 0.9 arrival's delay came out negative.
    requests = [Request(arrival_s=t, isl=256, osl=4) for t in (0.3, 0.9, 0.9)]
    run = simulate(PROFILE, ONE_P_ONE_D, 3, requests)
    assert [o.request.arrival_s for o in run.outcomes] == [0.3, 0.9, 0.9]
    assert all(o.end_s >= o.first_token_s > o.request.arrival_s for o in run.outcomes)
