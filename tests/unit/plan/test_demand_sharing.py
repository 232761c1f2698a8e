"""The device term's demand form (pdspec/plan/fleet_model.py, pdspec/plan/profile.py): a
prefill step demands the whole device, a decode step `decode_demand` of it, and every step
running on the device is stretched by max(1, the demands' sum); a step alone is never slowed,
a colocated step is a prefill step when it computes prompt tokens, and the profile refuses a
term it cannot mean."""

import json

import pytest
import simpy

from pdspec.plan import profile, workload
from pdspec.plan.fleet_model import Layout, Slo, _SharedDevice, simulate
from pdspec.plan.profile import DeviceSharing
from pdspec.plan.workload import Request
from tests.engine_profiles import synthetic

PROFILE = synthetic()
PREFILL, TRANSFER, DECODE0 = PROFILE.prefill.step_ms, PROFILE.transfer_ms, PROFILE.decode[0].step_ms


def demand(c: float) -> DeviceSharing:
    return DeviceSharing(form="demand", decode_demand=c, source="a unit test")


def step_ends_ms(sharing: DeviceSharing, steps: list[tuple[str, float]]) -> list[float]:
    """Each step's end (ms) when `steps` (kind, profiled ms) all start at once on one device."""
    env = simpy.Environment()
    device = _SharedDevice(env, sharing)
    ends = []
    for kind, step_ms in steps:
        device.run(step_ms, kind).callbacks.append(lambda _: ends.append(env.now * 1000))
    env.run()
    return ends


@pytest.mark.parametrize(
    ("kinds", "c", "stretch"),
    [
        (["prefill", "prefill"], 0.5, 2.0),  # two compute-bound steps: the device's time split
        (["prefill", "decode", "decode"], 0.5, 2.0),  # 1 + 0.5 + 0.5
        (["decode"] * 4, 0.25, 1.0),  # four decode steps fit in the device together
        (["decode"] * 4, 0.5, 2.0),
        (["prefill", "decode"], 0.3, 1.3),
    ],
    ids=str,
)
def test_steps_running_together_are_stretched_by_the_sum_of_their_demands_at_least_one(kinds, c, stretch):
    ends = step_ends_ms(demand(c), [(kind, 10.0) for kind in kinds])
    assert ends == pytest.approx([10.0 * stretch] * len(kinds), rel=1e-12)


@pytest.mark.parametrize("c", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_a_step_alone_on_a_shared_device_runs_at_its_profiled_time(kind, c):
    assert step_ends_ms(demand(c), [(kind, 37.5)]) == pytest.approx([37.5], rel=1e-12)


def test_the_demand_form_stretches_all_the_running_steps_alike_and_only_while_they_overlap():
    # A prefill step of 10 ms and a decode step of 30 ms, c = 0.5: together stretched 1.5, so
    # the prefill step ends at 15 ms, the decode step having done 10 ms of its work; alone
    # (demand 0.5, stretch 1) it does its other 20 ms by 35 ms.
    assert step_ends_ms(demand(0.5), [("prefill", 10.0), ("decode", 30.0)]) == pytest.approx([15.0, 35.0])


@pytest.mark.parametrize("c", [0.0, 0.5, 1.0])
def test_engines_that_never_overlap_on_a_shared_device_run_as_on_devices_of_their_own(c):
    # One request at a time through 1P1D: its prompt, then its decode steps, each alone on the device.
    requests = [Request(arrival_s=t, isl=1024, osl=6) for t in (0.0, 10.0, 20.0)]
    model = PROFILE.with_sharing(c, "a unit test", form="demand")
    shared = simulate(model, Layout.disaggregated(1, 1, devices=1), 3, requests)
    apart = simulate(model, Layout.disaggregated(1, 1), 3, requests)
    for one, other in zip(shared.outcomes, apart.outcomes):
        assert (one.ttft_s, one.end_s) == pytest.approx((other.ttft_s, other.end_s), rel=1e-12)


@pytest.mark.parametrize("c", [0.0, 0.25, 0.75, 1.0])
def test_colocated_steps_with_a_prompt_chunk_demand_the_device_and_without_one_demand_c(c):
    # Two alike requests at once on two colocated engines on one device, in lockstep: the
    # prompt steps run beside each other (demand 2), the decode steps too (demand 2c).
    model = PROFILE.with_sharing(c, "a unit test", form="demand")
    requests = [Request(0.0, isl=1024, osl=6), Request(0.0, isl=1024, osl=6)]
    run = simulate(model, Layout.aggregated(2, devices=1), 0, requests)
    for outcome in run.outcomes:
        assert outcome.ttft_s * 1000 == pytest.approx(PREFILL.at(1024) * 2, rel=1e-9)
        assert outcome.tpot_s * 1000 == pytest.approx(DECODE0.at(1) * max(1.0, 2 * c), rel=1e-9)


def test_a_prefill_engines_step_beside_a_decode_engines_is_stretched_one_plus_c():
    resident = Request(0.0, isl=1024, osl=1000)  # decodes throughout the newcomer's prompt
    prefill, transfer, decode = PREFILL.at(1024), TRANSFER.at(1024), DECODE0.at(1)
    newcomer = Request((prefill + transfer + decode / 2) / 1000, isl=1024, osl=1)
    model = PROFILE.with_sharing(0.4, "a unit test", form="demand")
    run = simulate(model, Layout.disaggregated(1, 1, devices=1), 0, [resident, newcomer])
    assert run.steps["prefill"][1][1] == pytest.approx(newcomer.arrival_s + prefill * 1.4 / 1000)


def test_with_no_device_shared_the_demand_form_gives_the_figures_of_the_alpha_form():
    requests = workload.poisson(40.0, 300, [(512, 64), (2048, 16), (64, 1)], seed=0)
    layout = Layout.disaggregated(2, 2, devices=4)
    base = synthetic(kv_tokens=20_000)
    alpha = simulate(base.with_sharing(0.35, "a unit test"), layout, 3, requests).summary(Slo(500, 50))
    demanded = simulate(base.with_sharing(1.0, "a unit test", "demand"), layout, 3, requests).summary(Slo(500, 50))
    assert (demanded.throughput_rps, demanded.ttft_ms.p90, demanded.tpot_ms.p90) == pytest.approx(
        (alpha.throughput_rps, alpha.ttft_ms.p90, alpha.tpot_ms.p90), rel=1e-12
    )


# The profile's side.

BASE = json.loads(synthetic().dump())


def test_a_demand_term_loads_dumps_with_its_form_and_round_trips(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**BASE, "device_sharing": {"form": "demand", "decode_demand": 0.5, "source": "a fit"}}))
    loaded = profile.load(path)
    assert (loaded.sharing.form, loaded.sharing.value, loaded.sharing.alpha) == ("demand", 0.5, None)
    assert json.loads(loaded.dump())["device_sharing"] == {"form": "demand", "decode_demand": 0.5, "source": "a fit"}
    path.write_text(loaded.dump())
    assert profile.load(path) == loaded


def test_an_alpha_term_dumps_as_before_the_demand_form():
    shared = synthetic().with_sharing(0.35, "a fit")
    assert json.loads(shared.dump())["device_sharing"] == {"alpha": 0.35, "source": "a fit"}
    assert synthetic().sharing.form == "alpha" and synthetic().sharing.value == profile.DEFAULT_SHARING_ALPHA


@pytest.mark.parametrize(
    "term",
    [
        {"form": "demand", "decode_demand": -0.1, "source": "a sign slip"},
        {"form": "demand", "decode_demand": 1.5, "source": "slows a lone decode step"},
        {"form": "demand", "source": "no demand"},
        {"form": "demand", "decode_demand": 0.5, "alpha": 0.3, "source": "both"},
        {"alpha": 0.3, "decode_demand": 0.5, "source": "a demand in the alpha form"},
        {"form": "roofline", "decode_demand": 0.5, "source": "an unknown form"},
    ],
    ids=["negative", "over-one", "missing", "alpha-too", "demand-in-alpha-form", "unknown-form"],
)
def test_a_demand_term_it_cannot_mean_is_refused(tmp_path, term):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**BASE, "device_sharing": term}))
    with pytest.raises(profile.ProfileError, match="bad.json"):
        profile.load(path)


def test_with_sharing_sets_the_demand_form_and_refuses_what_it_cannot_mean():
    plain = synthetic()
    shared = plain.with_sharing(0.25, "a test", form="demand")
    assert (shared.sharing.form, shared.sharing.decode_demand, plain.sharing.form) == ("demand", 0.25, "alpha")
    for value, message in ((-0.1, "decode demand is >= 0"), (1.1, "at most 1")):
        with pytest.raises(ValueError, match=message):
            plain.with_sharing(value, "a test", form="demand")
    with pytest.raises(ValueError, match="form"):
        plain.with_sharing(0.5, "a test", form="roofline")
