"""The engine profile tool's pure parts (loadtest/engine_bench/engine_profile.py): its
decode engines are built as a decode worker's (kv_consumer, the launcher's options), K=0
without a drafter; the measured engines themselves run by hand (the shipped CPU profile
says with what command)."""

import argparse

import pytest

from loadtest.engine_bench import engine_profile, engines
from pdspec.plan import profile


def args(**overrides) -> argparse.Namespace:
    base = dict(
        target=None,
        drafter=None,
        method="eagle3",
        max_model_len=2048,
        models_dir=profile.SHIPPED,  # any folder: the options only name its subfolders
        eager=True,
        gpu_memory_utilization=None,
        batch=[1, 8, 32],
        dummy=False,
    )
    return argparse.Namespace(**{**base, **overrides})


def test_a_decode_engine_is_a_decode_workers_with_the_k_asked_for():
    engine = engines.decode_worker_engine(args(), 3)
    assert engine["kv_transfer_config"]["kv_role"] == "kv_consumer"
    assert engine["speculative_config"]["num_speculative_tokens"] == 3 and engine["k"] == 3
    assert engine["max_num_seqs"] == 32 and engine["enforce_eager"] is True
    assert engine["env"]["PDSPEC_ROLE"] == "decode"


def test_k_0_is_a_decode_worker_without_a_drafter():
    engine = engines.decode_worker_engine(args(), 0)
    assert engine["method"] == "none" and "speculative_config" not in engine
    assert engine["kv_transfer_config"]["kv_role"] == "kv_consumer"


def test_transfer_points_are_read_and_sorted_and_a_run_without_drafts_gains_one_token_a_step():
    assert engine_profile.transfer_points(["2048:20", "512:6.1"]) == [(512, 6.1), (2048, 20.0)]
    assert engine_profile.drafts_of({}) == 1.0
    assert engine_profile.drafts_of({"vllm:spec_decode_num_drafts_total": 40.0}) == 40.0


def test_the_shipped_cpu_profile_loads_and_has_every_k_it_was_measured_for():
    shipped = profile.load(profile.shipped()["cpu-2core-pdspec-tiny-eagle3"])
    assert sorted(shipped.decode) == [0, 1, 2, 3, 5]
    assert shipped.decode[0].tokens_per_step == 1 and all(shipped.decode[k].tokens_per_step > 1 for k in (1, 2, 3, 5))


def test_a_given_kv_room_must_say_where_it_comes_from(capsys):
    base = ["--model-shape", "t", "--gpu", "g", "--transfer", "512:6", "--transfer-source", "x", "--out", "/tmp/p"]
    with pytest.raises(SystemExit):
        engine_profile.parse_args([*base, "--kv-tokens", "1000"])
    assert "--kv-tokens needs --kv-tokens-source" in capsys.readouterr().err
    parsed = engine_profile.parse_args([*base, "--kv-tokens", "1000", "--kv-tokens-source", "computed"])
    assert parsed.kv_tokens == 1000 and parsed.decode_context == 32 and not parsed.prefill_one_engine
