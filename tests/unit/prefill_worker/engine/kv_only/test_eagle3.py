"""The EAGLE3 KV-only pass's wiring (prefill_worker/engine/kv_only/eagle3.py), on stand-in
proposers (no engine): which calls take the pass and which keep vLLM's full drafter pass,
and the fallback when it fails. The pass's output against vLLM's own drafter forward is
tested on a real engine (tests/e2e/test_kv_only_equality.py)."""

import types

import pytest
import torch

from pdspec.worker.engine.control import LiveFlag, write_policy
from prefill_worker.engine.kv_only import eagle3
from prefill_worker.engine.kv_only.eagle3 import install_kv_only_v1, install_kv_only_v2
from tests.drafter_fakes import FakeV1Proposer, fake_drafter, v1_call


@pytest.fixture
def v1_class(monkeypatch):
    monkeypatch.setattr(eagle3, "kv_only_connector_reason", lambda: None)
    cls = type("Proposer", (FakeV1Proposer,), {})
    return cls


def test_v1_k0_takes_the_kv_only_pass_and_k3_the_full_one(v1_class, tmp_path):
    flag = LiveFlag(True, tmp_path / "switch")
    install_kv_only_v1(v1_class, flag)
    install_kv_only_v1(v1_class, flag)  # idempotent
    proposer = v1_class(fake_drafter())
    drafts = v1_call(proposer, 0)
    assert drafts.shape == (1, 0)
    v1_call(proposer, 3)
    assert proposer.calls == [("kv-only",), ("full", 3)]
    ((key, value, slots),) = proposer.model.model.layers[0].self_attn.attn.impl.writes
    assert slots.tolist() == [100, 101, 102, 103]
    write_policy(tmp_path / "switch", "off")
    v1_call(proposer, 0)
    assert proposer.calls[-1] == ("full", 0)


def test_v1_keeps_the_full_pass_for_unsupported_drafters_and_data_parallel(v1_class):
    install_kv_only_v1(v1_class, LiveFlag(True, None))
    dflash = v1_class(fake_drafter("DFlashQwen3ForCausalLM"))
    v1_call(dflash, 0)
    assert dflash.calls == [("full", 0)]
    dp = v1_class(fake_drafter())
    dp.vllm_config.parallel_config.data_parallel_size = 2
    v1_call(dp, 0)
    assert dp.calls == [("full", 0)]


def test_v1_keeps_the_full_pass_under_a_layer_by_layer_kv_connector(monkeypatch):
    cls = type("Proposer", (FakeV1Proposer,), {})
    monkeypatch.setattr(eagle3, "kv_only_connector_reason", lambda: "a KV connector that works layer by layer")
    install_kv_only_v1(cls, LiveFlag(True, None))
    proposer = cls(fake_drafter())
    v1_call(proposer, 0)
    assert proposer.calls == [("full", 0)]


class FakeV2Speculator:
    method = "eagle3"
    pcp_manager = None
    supports_mm_inputs = False
    dp_size = 1
    max_num_reqs = 4

    def __init__(self, model):
        self.model = model
        self.input_buffers = types.SimpleNamespace(
            input_ids=torch.zeros(16, dtype=torch.int64), positions=torch.zeros(16, dtype=torch.int64)
        )
        self.last_token_indices = torch.zeros(4, dtype=torch.int64)
        self.current_draft_step = torch.zeros((), dtype=torch.int64)
        self.draft_tokens = torch.zeros(4, 3, dtype=torch.int64)
        self.calls = []

    def propose(
        self,
        input_batch,
        attn_metadata,
        slot_mappings,
        last_hidden_states,
        aux_hidden_states,
        num_sampled,
        num_rejected,
        last_sampled,
        next_prefill_tokens,
        temperature,
        seeds,
        dp_sync_state=None,
        dummy_run=False,
        skip_attn_for_dummy_run=False,
        mm_inputs=None,
        is_profile=False,
        num_speculative_tokens=None,
    ):
        self.calls.append(("full", num_speculative_tokens))
        return self.draft_tokens[: input_batch.num_reqs]

    def _pdspec_kv_only_pass(self, kv_pass, *args):
        self.calls.append(("kv-only",))
        kv_pass.run(*args)


def fake_prepare_prefill_inputs(last_token_indices, current_draft_step, input_buffers, input_batch, *rest):
    n = input_batch.num_tokens
    input_buffers.input_ids[:n] = input_batch.input_ids + 1
    input_buffers.positions[:n] = torch.arange(n)


def v2_call(spec, k, **kwargs):
    batch = types.SimpleNamespace(num_reqs=2, num_tokens=3, input_ids=torch.tensor([4, 5, 6]))
    slots = {"model.layers.4.self_attn.attn": torch.tensor([7, 8, 9, -1])}  # padded to 4
    aux = [torch.randn(4, 8) for _ in range(3)]
    return spec.propose(
        input_batch=batch,
        attn_metadata={},
        slot_mappings=slots,
        last_hidden_states=torch.randn(4, 8),
        aux_hidden_states=aux,
        num_sampled=None,
        num_rejected=None,
        last_sampled=None,
        next_prefill_tokens=None,
        temperature=None,
        seeds=None,
        num_speculative_tokens=k,
        **kwargs,
    )


@pytest.fixture
def v2_class(monkeypatch):
    monkeypatch.setattr(eagle3, "kv_only_connector_reason", lambda: None)
    monkeypatch.setattr(eagle3, "_v2_prepare_prefill_inputs", lambda: fake_prepare_prefill_inputs)
    cls = type("Speculator", (FakeV2Speculator,), {})
    install_kv_only_v2(cls, LiveFlag(True, None))
    return cls


def test_v2_k0_takes_the_kv_only_pass_with_the_target_steps_slots(v2_class):
    spec = v2_class(fake_drafter())
    drafts = v2_call(spec, 0)
    assert spec.calls == [("kv-only",)]
    assert drafts.shape == (2, 3) and (drafts == -1).all()  # "no drafts", as vLLM's K=0 path returns
    ((key, value, slots),) = spec.model.model.layers[0].self_attn.attn.impl.writes
    assert slots.tolist() == [7, 8, 9]  # the real tokens only, not the CUDA-graph padding
    assert key.shape[0] == 3


def test_v2_keeps_the_full_pass_for_drafts_dummy_runs_dp_and_cp(v2_class):
    spec = v2_class(fake_drafter())
    v2_call(spec, 3)
    v2_call(spec, 0, dummy_run=True)
    v2_call(spec, 0, dp_sync_state=object())
    spec.dp_size = 2
    v2_call(spec, 0)
    spec.dp_size, spec.pcp_manager = 1, object()
    v2_call(spec, 0)
    assert spec.calls == [("full", 3), ("full", 0), ("full", 0), ("full", 0), ("full", 0)]


def test_a_failing_pass_falls_back_to_the_full_pass_for_good(v1_class):
    install_kv_only_v1(v1_class, LiveFlag(True, None))
    proposer = v1_class(fake_drafter())

    def broken(*args):
        raise RuntimeError("internals differ")

    proposer._pdspec_kv_only_pass = broken
    v1_call(proposer, 0)
    v1_call(proposer, 0)
    assert proposer.calls == [("full", 0), ("full", 0)]
