"""seeded_first_step: a new seeded request that vLLM padded with placeholder drafts (one
token left to compute: a P/D decode, a full prefix hit) computes its one token without
them, as a colocated prefill's last step does; every other request keeps vLLM's padding."""

from types import SimpleNamespace

import pytest

from pdspec.worker.engine.seeded_first_step import unpad_seeded_first_steps

vllm_sampling = pytest.importorskip("vllm.sampling_params")
K = 3


def new_request(req_id: str, **sampling: object) -> SimpleNamespace:
    return SimpleNamespace(req_id=req_id, sampling_params=vllm_sampling.SamplingParams(**sampling))


def step(new_requests, scheduled, spec):
    return SimpleNamespace(
        scheduled_new_reqs=new_requests,
        num_scheduled_tokens=dict(scheduled),
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens=dict(spec),
    )


def test_a_padded_new_seeded_request_computes_its_one_token_alone():
    output = step(
        [
            new_request("seeded", temperature=1.0, seed=1234),
            new_request("unseeded", temperature=1.0),
            new_request("greedy-seeded", temperature=0.0, seed=7),
            new_request("prefill", temperature=1.0, seed=5),
        ],
        {"seeded": 1 + K, "unseeded": 1 + K, "greedy-seeded": 1 + K, "prefill": 40, "running": 1 + K},
        {"seeded": [-1] * K, "unseeded": [-1] * K, "greedy-seeded": [-1] * K, "running": [-1] * K},
    )
    assert unpad_seeded_first_steps(output) == ["seeded"]
    assert output.num_scheduled_tokens == {
        "seeded": 1,
        "unseeded": 1 + K,
        "greedy-seeded": 1 + K,
        "prefill": 40,
        "running": 1 + K,
    }
    assert output.total_num_scheduled_tokens == 1 + 40 + 3 * (1 + K)
    assert "seeded" not in output.scheduled_spec_decode_tokens
    # A running request's drafts (placeholders under async scheduling) are its own.
    assert output.scheduled_spec_decode_tokens["running"] == [-1] * K


def test_a_step_without_drafts_is_left_alone():
    output = step([new_request("seeded", temperature=1.0, seed=1)], {"seeded": 7}, {})
    assert unpad_seeded_first_steps(output) == [] and output.num_scheduled_tokens == {"seeded": 7}
