"""The KV-only drafter pass's wiring, on stand-in proposers (no engine): which calls take
the pass and which keep vLLM's full drafter pass, the live switch, and the K/V projection.
The pass's output against vLLM's own drafter forward is tested on a real engine
(tests/e2e/test_kv_only_equality.py)."""

import types

import pytest
import torch

from pdspec.worker.engine import control, kv_only
from pdspec.worker.engine.kv_only_kernels import KvOnlyDrafterPass, _kv_projection
from pdspec.worker.engine.control import LiveFlag, write_policy
from pdspec.worker.engine.kv_only import install_kv_only_v1, install_kv_only_v2


def test_live_flag_follows_its_file(tmp_path):
    path = tmp_path / "kv-only"
    flag = LiveFlag(True, path)
    assert flag.current() is True  # no file: the start-up value
    write_policy(path, "off")
    assert flag.current() is False
    path.write_text("maybe")
    import os

    os.utime(path, ns=(1, 1))
    assert flag.current() is False  # unknown text: keeps the last value
    write_policy(path, "on")
    assert flag.current() is True


def test_start_value_from_environment(monkeypatch):
    monkeypatch.delenv(control.KV_ONLY_FILE_ENV, raising=False)
    monkeypatch.setenv(control.KV_ONLY_ENV, "0")
    assert LiveFlag.kv_only_from_env().current() is False
    monkeypatch.setenv(control.KV_ONLY_ENV, "1")
    assert LiveFlag.kv_only_from_env().current() is True


class Backend:
    forward_includes_kv_cache_update = False


class Impl:
    def __init__(self):
        self.writes = []

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        self.writes.append((key.clone(), value.clone(), slot_mapping.clone()))


class QKV(torch.nn.Module):
    """Stand-in fused QKV projection (returns (output, bias) as vLLM's linear layers do)."""

    def __init__(self, hidden_in, q, kv, keep_weight=True):
        super().__init__()
        self.quant_method = type("UnquantizedLinearMethod", (), {})()
        weight = torch.randn(q + 2 * kv, hidden_in)
        self.full = weight.clone()
        self.weight = torch.nn.Parameter(weight if keep_weight else torch.empty(0), requires_grad=False)
        self.bias = None

    def forward(self, x):
        return torch.nn.functional.linear(x, self.full), None


def fake_drafter(class_name="Eagle3LlamaForCausalLM", layers=1, backend=Backend):
    hidden, heads, kv_heads, head = 8, 2, 1, 4
    attn_layer = types.SimpleNamespace(
        impl=Impl(), attn_backend=backend, kv_cache=torch.zeros(1), layer_name="model.layers.4.self_attn.attn",
        num_kv_heads=kv_heads, head_size=head, head_size_v=head, kv_sharing_target_layer_name=None,
    )  # fmt: skip

    def rotary(positions, query, key=None):
        return query * 2, key  # stand-in: a visible change to K only

    self_attn = types.SimpleNamespace(
        attn=attn_layer, q_size=heads * head, kv_size=kv_heads * head, rotary_emb=rotary,
        qkv_proj=QKV(2 * hidden, heads * head, kv_heads * head),
    )  # fmt: skip

    def norm(x, residual=None):
        return (x + 1, residual) if residual is not None else x + 1

    layer = types.SimpleNamespace(
        layer_idx=0, self_attn=self_attn, input_layernorm=norm, hidden_norm=lambda hidden_states: hidden_states
    )  # fmt: skip
    inner = types.SimpleNamespace(
        layers=[layer] * layers, embed_input_ids=lambda ids: torch.ones(len(ids), hidden), norm_output=False
    )  # fmt: skip
    cls = type(class_name, (), {"combine_hidden_states": lambda self, h: h[:, :hidden]})
    model = cls()
    model.model = inner
    return model


def test_supported_drafter_and_reasons_for_the_rest():
    assert KvOnlyDrafterPass.unsupported_reason(fake_drafter()) is None
    assert "DFlash" in KvOnlyDrafterPass.unsupported_reason(fake_drafter("DFlashQwen3ForCausalLM"))

    class InsideAttention:
        forward_includes_kv_cache_update = True

    assert "inside attention" in KvOnlyDrafterPass.unsupported_reason(fake_drafter(backend=InsideAttention))


def test_pass_writes_rotated_k_and_v_to_the_given_slots():
    model = fake_drafter()
    kv_pass = KvOnlyDrafterPass(model)
    ids, positions = torch.tensor([5, 6, 7]), torch.tensor([0, 1, 2])
    hidden = torch.randn(3, 8)
    slots = torch.tensor([32, 33, 34])
    kv_pass.run(ids, positions, hidden, slots)
    (key, value, written_slots), = model.model.layers[0].self_attn.attn.impl.writes
    x = torch.cat([torch.ones(3, 8) + 1, hidden], dim=-1)  # input_layernorm(embeds), hidden_norm(hidden)
    qkv = torch.nn.functional.linear(x, model.model.layers[0].self_attn.qkv_proj.full)
    assert torch.equal(key.reshape(3, -1), qkv[:, 8:12] * 2)
    assert torch.equal(value.reshape(3, -1), qkv[:, 12:16])
    assert torch.equal(written_slots, slots)


def test_kv_projection_multiplies_only_k_and_v_rows_when_the_weight_is_there():
    torch.manual_seed(0)
    plain = QKV(16, 8, 4)
    k, v = _kv_projection(plain, 8, 4)(x := torch.randn(5, 16))
    qkv, _ = plain(x)
    torch.testing.assert_close(k, qkv[:, 8:12], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v, qkv[:, 12:16], rtol=1e-6, atol=1e-6)
    repacked = QKV(16, 8, 4, keep_weight=False)  # the CPU build drops the weight for oneDNN
    k, v = _kv_projection(repacked, 8, 4)(x)
    qkv, _ = repacked(x)
    assert torch.equal(k, qkv[:, 8:12]) and torch.equal(v, qkv[:, 12:16])


class FakeV1Proposer:
    method = "eagle3"
    needs_extra_input_slots = False
    supports_mm_inputs = False
    uses_mrope = False
    device = "cpu"

    def __init__(self, model):
        self.model = model
        self.vllm_config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(data_parallel_size=1))
        self.input_ids = torch.zeros(16, dtype=torch.int64)
        self.positions = torch.zeros(16, dtype=torch.int64)
        self.hidden_states = torch.zeros(16, 8)
        self.calls = []

    def propose(self, num_speculative_tokens, **kwargs):
        self.calls.append(("full", num_speculative_tokens))
        return torch.zeros(1, num_speculative_tokens, dtype=torch.int64)

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions, target_hidden_states,
                              token_indices_to_sample, cad, num_rejected_tokens_gpu):  # fmt: skip
        n = target_token_ids.shape[0]
        self.input_ids[: n - 1] = target_token_ids[1:]
        self.input_ids[n - 1] = next_token_ids[0]
        self.positions[:n] = target_positions
        self.hidden_states[:n] = target_hidden_states
        return n, None, cad

    def _get_positions(self, n):
        return self.positions[:n]

    def _get_slot_mapping(self, n, slot_mapping):
        return {"model.layers.4.self_attn.attn": slot_mapping[:n]}

    def _pdspec_kv_only_pass(self, kv_pass, *args):
        self.calls.append(("kv-only",))
        kv_pass.run(*args)


def v1_call(proposer, k):
    cad = types.SimpleNamespace(batch_size=lambda: 1, slot_mapping=torch.arange(100, 104))
    return proposer.propose(
        k, target_token_ids=torch.tensor([1, 2, 3, 4]), target_positions=torch.arange(4),
        target_hidden_states=torch.randn(4, 24), next_token_ids=torch.tensor([9]), token_indices_to_sample=None,
        common_attn_metadata=cad, sampling_metadata=None,
    )  # fmt: skip


@pytest.fixture
def v1_class(monkeypatch):
    monkeypatch.setattr(kv_only, "kv_only_connector_reason", lambda: None)
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
    (key, value, slots), = proposer.model.model.layers[0].self_attn.attn.impl.writes
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
    monkeypatch.setattr(kv_only, "kv_only_connector_reason", lambda: "a KV connector that works layer by layer")
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

    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states, num_sampled,
                num_rejected, last_sampled, next_prefill_tokens, temperature, seeds, dp_sync_state=None,
                dummy_run=False, skip_attn_for_dummy_run=False, mm_inputs=None, is_profile=False,
                num_speculative_tokens=None):  # fmt: skip
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
        input_batch=batch, attn_metadata={}, slot_mappings=slots, last_hidden_states=torch.randn(4, 8),
        aux_hidden_states=aux, num_sampled=None, num_rejected=None, last_sampled=None, next_prefill_tokens=None,
        temperature=None, seeds=None, num_speculative_tokens=k, **kwargs,
    )  # fmt: skip


@pytest.fixture
def v2_class(monkeypatch):
    monkeypatch.setattr(kv_only, "kv_only_connector_reason", lambda: None)
    monkeypatch.setattr(kv_only, "_v2_prepare_prefill_inputs", lambda: fake_prepare_prefill_inputs)
    cls = type("Speculator", (FakeV2Speculator,), {})
    install_kv_only_v2(cls, LiveFlag(True, None))
    return cls


def test_v2_k0_takes_the_kv_only_pass_with_the_target_steps_slots(v2_class):
    spec = v2_class(fake_drafter())
    drafts = v2_call(spec, 0)
    assert spec.calls == [("kv-only",)]
    assert drafts.shape == (2, 3) and (drafts == -1).all()  # "no drafts", as vLLM's K=0 path returns
    (key, value, slots), = spec.model.model.layers[0].self_attn.attn.impl.writes
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


def test_kv_rows_read_back_from_a_packed_cpu_layer():
    """The CPU build keeps no weight; the K/V rows come back through the layer itself and
    are packed by vLLM's own CPU GEMM dispatch, so the hot path skips the Q rows."""
    pytest.importorskip("vllm")
    torch.manual_seed(0)

    class Packed(QKV):
        input_size, params_dtype = 32, torch.float32

        def __init__(self):
            super().__init__(32, 16, 8, keep_weight=False)
            self.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, self.full)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return super().forward(x)

    layer = Packed()
    project = _kv_projection(layer, 16, 8)
    calls_to_build = layer.calls
    x = torch.randn(6, 32)
    k, v = project(x)
    assert layer.calls == calls_to_build  # the Q rows are not multiplied per step
    qkv, _ = layer(x)
    torch.testing.assert_close(k, qkv[:, 16:24], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, qkv[:, 24:32], rtol=1e-5, atol=1e-5)


def test_a_failing_pass_falls_back_to_the_full_pass_for_good(v1_class):
    install_kv_only_v1(v1_class, LiveFlag(True, None))
    proposer = v1_class(fake_drafter())

    def broken(*args):
        raise RuntimeError("internals differ")

    proposer._pdspec_kv_only_pass = broken
    v1_call(proposer, 0)
    v1_call(proposer, 0)
    assert proposer.calls == [("full", 0), ("full", 0)]
