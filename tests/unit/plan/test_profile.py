"""Engine profiles (pdspec/plan/profile.py): a curve interpolates between its points and
extrapolates past them as the docstring says, and a file that is not a profile of the
schema is refused whole, naming itself."""

import json

import pytest

from pdspec.plan import profile
from pdspec.plan.profile import Curve

PROFILE = {
    "schema": profile.SCHEMA,
    "model_shape": "t",
    "drafter": "eagle3 (t)",
    "gpu": "cpu-2core",
    "vllm_version": "0.32.0",
    "measured": "by hand",
    "prefill": {"max_num_batched_tokens": 512, "step_ms": {"points": [[128, 10], [512, 30]]}},
    "decode": {"0": {"step_ms": {"points": [[1, 5], [8, 9]]}, "tokens_per_step": 1}},
    "transfer_ms": {"points": [[16, 1], [2048, 5]]},
    "kv_tokens": 100000,
}


def test_a_curve_is_linear_between_points_and_follows_its_last_segment_past_them():
    curve = Curve(points=[(1, 5), (8, 12), (16, 14)])
    assert curve.at(0) == 5 and curve.at(1) == 5
    assert curve.at(4.5) == pytest.approx(8.5)
    assert curve.at(32) == pytest.approx(18)  # 14 + 16 * (2 / 8)
    assert Curve(points=[(1, 5), (8, 12), (16, 11)]).at(32) == 11  # noise that falls is not followed
    assert Curve(points=[(100, 10)]).at(300) == pytest.approx(30)  # one point: in proportion


def test_a_curves_fixed_part_is_its_first_segment_extended_to_zero():
    assert Curve(points=[(64, 10.28), (128, 14.73), (512, 46.09)]).intercept() == pytest.approx(5.83)
    assert Curve(points=[(10, 1), (20, 10)]).intercept() == 0  # never below zero
    assert Curve(points=[(100, 10)]).intercept() == 0  # one point: in proportion to x


def test_points_must_increase_in_x():
    with pytest.raises(ValueError):
        Curve(points=[(8, 1), (4, 2)])


def test_a_profile_round_trips_through_its_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILE))
    loaded = profile.load(path)
    assert loaded.decode[0].step_ms.at(8) == 9 and loaded.prefill.step_ms.at(256) == pytest.approx(16.6667, rel=1e-4)
    path.write_text(loaded.dump())
    assert profile.load(path) == loaded


@pytest.mark.parametrize(
    "broken",
    [
        {**PROFILE, "schema": "pdspec.engine-profile/0"},
        {**PROFILE, "decode": {}},
        {**PROFILE, "kv_tokens": 0},
        {**PROFILE, "surprise": 1},
        {**PROFILE, "device_sharing": {"alpha": -0.1, "source": "a sign slip"}},
        {**PROFILE, "device_sharing": {"alpha": 0.5}},
    ],
    ids=["schema", "no-k", "no-kv", "unknown-field", "negative-alpha", "alpha-without-source"],
)
def test_anything_else_is_refused_naming_the_file(tmp_path, broken):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(profile.ProfileError, match="bad.json"):
        profile.load(path)


def test_an_acceptance_rate_replaces_each_ks_tokens_per_step_and_keeps_the_step_times():
    measured = profile.EngineProfile.model_validate(
        {**PROFILE, "decode": {str(k): {"step_ms": {"points": [[1, 5 + k]]}, "tokens_per_step": 1} for k in (0, 1, 3)}}
    )
    given = measured.with_acceptance(0.5)
    assert given.decode[0].tokens_per_step == 1  # no drafts, one token
    assert given.decode[1].tokens_per_step == pytest.approx(1.5)  # 1 + 0.5
    assert given.decode[3].tokens_per_step == pytest.approx(1.875)  # 1 + 0.5 + 0.25 + 0.125
    assert [given.decode[k].step_ms for k in (0, 1, 3)] == [measured.decode[k].step_ms for k in (0, 1, 3)]
    assert measured.decode[3].tokens_per_step == 1  # a copy: the measured profile is unchanged
    for rate in (0, 1, 1.2):
        with pytest.raises(ValueError):
            measured.with_acceptance(rate)


def test_a_step_cheaper_with_more_requests_or_more_drafts_is_an_anomaly():
    clean = profile.EngineProfile.model_validate(
        {
            **PROFILE,
            "decode": {
                "0": {"step_ms": {"points": [[1, 10], [64, 20]]}, "tokens_per_step": 1},
                "1": {"step_ms": {"points": [[1, 14], [64, 26]]}, "tokens_per_step": 1.5},
            },
        }
    )
    assert clean.anomalies() == []
    noisy = clean.model_copy(
        update={
            "decode": {
                0: clean.decode[0],
                1: profile.DecodeProfile(step_ms=Curve(points=[(1, 14), (32, 30), (64, 12)]), tokens_per_step=1.5),
            }
        }
    )
    found = noisy.anomalies()
    assert any("K=1: a step of 64 requests (12 ms) costs less than of 32 (30 ms)" in a for a in found)
    assert any(a.startswith("K=1 at 64 requests (12 ms) costs less than K=0") for a in found)
    assert clean.model_copy(update={"decode": {0: clean.decode[0]}}).anomalies() == []
    assert len(profile.load(profile.shipped()["h200-qwen3-8b-eagle3"]).anomalies()) > 0  # as measured: noisy


def test_the_shipped_profiles_load_and_say_their_gpu_and_drafter_in_their_names():
    """Each shipped profile is found by `<gpu>-<model>-<drafter>`: the name `pdspec plan
    --profile` takes, so its gpu and drafter must be the ones the name says. The H100 ones
    (loadtest/results/plan/h100-profile/) have the H100's KV room and the H200's hand-off."""
    shipped = profile.shipped()
    assert list(shipped) == [
        "cpu-2core-pdspec-tiny-eagle3",
        "h100-qwen3-8b-dflash",
        "h100-qwen3-8b-eagle3",
        "h200-qwen3-8b-eagle3",
    ]
    for name, path in shipped.items():
        loaded = profile.load(path)
        assert name.startswith(f"{loaded.gpu}-") and name.endswith("-" + loaded.drafter.split()[0]), name
    eagle3, dflash = (profile.load(shipped[f"h100-qwen3-8b-{d}"]) for d in ("eagle3", "dflash"))
    assert sorted(eagle3.decode) == [0, 1, 2, 3, 5] and sorted(dflash.decode) == [0, 8, 16]
    assert (eagle3.kv_tokens, dflash.kv_tokens) == (380_000, 341_000)  # 0.9 x 81,559 MiB, as computed
    for h100 in (eagle3, dflash):
        assert {d.tokens_per_step for d in h100.decode.values()} == {1.0}  # random weights: no draft accepted
        assert h100.transfer_ms.points == [(1, 70.3), (4096, 86)] and "one H200" in h100.measured
    # The EAGLE3 one's device term was fitted on its own fleet (loadtest/results/plan/check-h100-fleet/);
    # no DFlash fleet has run.
    assert (eagle3.device_sharing.form, eagle3.device_sharing.prefill_alpha) == ("prefill", 1.85)
    assert "h100-qwen3-8b/call-5" in eagle3.device_sharing.source and dflash.device_sharing is None


def test_the_device_term_is_alpha_one_unless_the_profile_has_one_and_round_trips(tmp_path):
    plain = profile.EngineProfile.model_validate(PROFILE)
    assert plain.device_sharing is None and plain.sharing.alpha == profile.DEFAULT_SHARING_ALPHA == 1.0
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**PROFILE, "device_sharing": {"alpha": 0.35, "source": "a fit"}}))
    fitted = profile.load(path)
    assert fitted.sharing.alpha == 0.35
    path.write_text(fitted.dump())
    assert profile.load(path) == fitted


def test_with_sharing_replaces_alpha_in_a_copy_and_refuses_a_negative_one():
    plain = profile.EngineProfile.model_validate(PROFILE)
    shared = plain.with_sharing(2.5, "a test")
    assert (shared.sharing.alpha, shared.device_sharing.source, plain.sharing.alpha) == (2.5, "a test", 1.0)
    assert plain.with_sharing(0.0, "a test").sharing.alpha == 0.0  # no effect at all: allowed
    with pytest.raises(ValueError, match="alpha"):
        plain.with_sharing(-0.01, "a test")
