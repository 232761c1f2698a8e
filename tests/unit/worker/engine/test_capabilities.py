"""What this vLLM build offers (pdspec/worker/engine/capabilities.py): an unknown version is
refused, the CPU build gets the K override."""

import types

import pytest

from pdspec.worker.engine import capabilities


def test_unknown_vllm_version_is_refused(monkeypatch):
    vllm = pytest.importorskip("vllm")
    monkeypatch.setattr(vllm, "__version__", "0.40.0")
    with pytest.raises(capabilities.UnsupportedVllmError, match="0.40.0"):
        capabilities.detect_capabilities(types.SimpleNamespace(use_v2_model_runner=False))


def test_cpu_build_uses_the_k_override():
    pytest.importorskip("vllm")
    caps = capabilities.detect_capabilities(types.SimpleNamespace(use_v2_model_runner=False))
    assert caps.native_skip is False
