"""The device term's prefill form (pdspec/plan/fleet_model.py, pdspec/plan/profile.py): while
m steps run at once on a device, a prefill step is stretched by 1 + prefill_alpha (m - 1) and a
decode step not at all, and p prefill steps running together each at least p times as long;
the two kinds keep their own clocks, a step alone is never slowed, a
colocated step is a prefill step when it computes prompt tokens, and the profile refuses a
term it cannot mean."""

import json

import pytest
import simpy

from pdspec.plan import profile
from pdspec.plan.fleet_model import Layout, _SharedDevice, simulate
from pdspec.plan.profile import DeviceSharing
from pdspec.plan.workload import Request
from tests.engine_profiles import synthetic

PROFILE = synthetic()
PREFILL, TRANSFER, DECODE0 = PROFILE.prefill.step_ms, PROFILE.transfer_ms, PROFILE.decode[0].step_ms


def prefill_form(a: float) -> DeviceSharing:
    return DeviceSharing(form="prefill", prefill_alpha=a, source="a unit test")


def step_ends_ms(sharing: DeviceSharing, steps: list[tuple[str, float]]) -> list[float]:
    """Each step's end (ms), in the order they end, when `steps` (kind, profiled ms) all start
    at once on one device."""
    env = simpy.Environment()
    device = _SharedDevice(env, sharing)
    ends = []
    for kind, step_ms in steps:
        device.run(step_ms, kind).callbacks.append(lambda _, kind=kind: ends.append((kind, env.now * 1000)))
    env.run()
    return ends


@pytest.mark.parametrize(
    ("kinds", "a", "prefill_stretch"),
    [
        (["prefill", "prefill"], 1.0, 2.0),  # two prefill steps: the device's time split
        (["prefill", "prefill"], 0.38, 2.0),  # never less: compute-bound steps cannot together outrun it
        (["prefill"] * 3 + ["decode"], 0.38, 3.0),  # 1 + 0.38 x 3 = 2.14, but three prefills
        (["prefill", "decode", "decode", "decode"], 0.38, 2.14),
        (["prefill", "decode"], 0.4, 1.4),
        (["prefill", "decode", "decode"], 0.4, 1.8),  # every running step counts against a prefill
        (["prefill", "prefill", "decode"], 0.5, 2.0),
    ],
    ids=str,
)
def test_prefill_steps_are_stretched_by_every_step_beside_them_and_decode_steps_by_none(kinds, a, prefill_stretch):
    # Decode steps of 100 ms outlast the prefill steps of 10 ms: the prefill steps end first,
    # stretched; the decode steps at their profiled 100 ms whatever ran beside them.
    steps = [(kind, 10.0 if kind == "prefill" else 100.0) for kind in kinds]
    ends = step_ends_ms(prefill_form(a), steps)
    assert [end for kind, end in ends if kind == "prefill"] == pytest.approx(
        [10.0 * prefill_stretch] * kinds.count("prefill")
    )
    assert [end for kind, end in ends if kind == "decode"] == pytest.approx([100.0] * kinds.count("decode"))


@pytest.mark.parametrize("a", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_a_step_alone_on_a_shared_device_runs_at_its_profiled_time(kind, a):
    assert step_ends_ms(prefill_form(a), [(kind, 37.5)]) == [(kind, pytest.approx(37.5, rel=1e-12))]


def test_a_prefill_step_speeds_up_when_the_decode_step_beside_it_ends():
    # A prefill step of 30 ms beside a decode step of 10 ms, a = 0.5: stretched 1.5 while both
    # run, so at 10 ms (the decode step's end) it has done 10 / 1.5 ms, and alone it does the
    # rest, 30 - 6.67 ms, by 33.33 ms.
    ends = step_ends_ms(prefill_form(0.5), [("prefill", 30.0), ("decode", 10.0)])
    assert ends == [("decode", pytest.approx(10.0)), ("prefill", pytest.approx(10.0 + 30.0 - 10.0 / 1.5))]


def test_a_prefill_engines_step_beside_a_decode_engines_is_stretched_and_the_decode_is_not():
    resident = Request(0.0, isl=1024, osl=1000)  # decodes throughout the newcomer's prompt
    prefill, transfer, decode = PREFILL.at(1024), TRANSFER.at(1024), DECODE0.at(1)
    newcomer = Request((prefill + transfer + decode / 2) / 1000, isl=1024, osl=1)
    model = PROFILE.with_sharing(0.4, "a unit test", form="prefill")
    run = simulate(model, Layout.disaggregated(1, 1, devices=1), 0, [resident, newcomer])
    assert run.steps["prefill"][1][1] == pytest.approx(newcomer.arrival_s + prefill * 1.4 / 1000)
    prefill_start, prefill_end = run.steps["prefill"][1]
    beside = [(start, end) for start, end in run.steps["decode"] if start < prefill_end and end > prefill_start]
    assert beside and all((end - start) * 1000 == pytest.approx(decode, rel=1e-9) for start, end in beside)


@pytest.mark.parametrize("a", [0.0, 0.4, 1.5])
def test_colocated_steps_with_a_prompt_chunk_are_stretched_and_without_one_are_not(a):
    # Two alike requests at once on two colocated engines on one device, in lockstep: the
    # prompt steps beside each other (two compute-bound steps: each stretched max(1 + a, 2)),
    # the decode steps at their own time.
    model = PROFILE.with_sharing(a, "a unit test", form="prefill")
    requests = [Request(0.0, isl=1024, osl=6), Request(0.0, isl=1024, osl=6)]
    run = simulate(model, Layout.aggregated(2, devices=1), 0, requests)
    for outcome in run.outcomes:
        assert outcome.ttft_s * 1000 == pytest.approx(PREFILL.at(1024) * max(1 + a, 2), rel=1e-9)
        assert outcome.tpot_s * 1000 == pytest.approx(DECODE0.at(1), rel=1e-9)


# The profile's side.

BASE = json.loads(synthetic().dump())


def test_a_prefill_term_loads_dumps_with_its_form_and_round_trips(tmp_path):
    path = tmp_path / "p.json"
    term = {"form": "prefill", "prefill_alpha": 0.38, "source": "a measurement"}
    path.write_text(json.dumps({**BASE, "device_sharing": term}))
    loaded = profile.load(path)
    assert (loaded.sharing.form, loaded.sharing.value, loaded.sharing.alpha) == ("prefill", 0.38, None)
    assert json.loads(loaded.dump())["device_sharing"] == term
    path.write_text(loaded.dump())
    assert profile.load(path) == loaded


@pytest.mark.parametrize(
    "term",
    [
        {"form": "prefill", "prefill_alpha": -0.1, "source": "a sign slip"},
        {"form": "prefill", "source": "no value"},
        {"form": "prefill", "prefill_alpha": 0.4, "alpha": 0.3, "source": "both"},
        {"form": "demand", "decode_demand": 0.5, "prefill_alpha": 0.3, "source": "another form's too"},
        {"alpha": 0.3, "prefill_alpha": 0.5, "source": "a prefill alpha in the alpha form"},
    ],
    ids=["negative", "missing", "alpha-too", "in-demand-form", "in-alpha-form"],
)
def test_a_prefill_term_it_cannot_mean_is_refused(tmp_path, term):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**BASE, "device_sharing": term}))
    with pytest.raises(profile.ProfileError, match="bad.json"):
        profile.load(path)


def test_with_sharing_sets_the_prefill_form_and_refuses_a_negative_value():
    shared = synthetic().with_sharing(0.38, "a test", form="prefill")
    assert (shared.sharing.form, shared.sharing.prefill_alpha) == ("prefill", 0.38)
    with pytest.raises(ValueError, match="prefill alpha is >= 0"):
        synthetic().with_sharing(-0.1, "a test", form="prefill")
