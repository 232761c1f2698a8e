"""The ready-made GPU profiles load and give the seed workloads' vLLM settings."""

import json
from pathlib import Path

import pytest
from pydantic_settings import CliApp

from pdspec.settings import UpCommand
from pdspec.worker.launch import vllm_argv, worker_env

PROFILES = Path(__file__).resolve().parents[2] / "deploy" / "profiles"


def load(monkeypatch, name) -> UpCommand:
    monkeypatch.setenv("PDSPEC_CONFIG", str(PROFILES / name))
    return CliApp.run(UpCommand, cli_args=[])


@pytest.mark.parametrize("name, method, k", [("qwen3-8b-eagle3.toml", "eagle3", 3), ("qwen3-8b-dflash.toml", "dflash", 16)])
def test_gpu_profiles(monkeypatch, tmp_path, name, method, k):
    up = load(monkeypatch, name)
    for role, worker, gpu in (("prefill", up.prefill, "0"), ("decode", up.decode, "1")):
        argv = vllm_argv(role, up.model, worker, cpu=False)
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec["method"] == method and spec["num_speculative_tokens"] == k
        assert spec["model"] == up.model.drafter
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_buffer_device"] == "cuda"
        assert worker_env(role, worker, tmp_path, cpu=False)["CUDA_VISIBLE_DEVICES"] == gpu
    # Only paths differ from the seed workload: the user edits those and nothing else.
    assert up.model.target.startswith("/models/") and up.model.drafter.startswith("/models/")


def test_paths_can_be_overridden_without_editing_the_file(monkeypatch):
    monkeypatch.setenv("PDSPEC_MODEL__TARGET", "/data/qwen")
    up = load(monkeypatch, "qwen3-8b-eagle3.toml")
    assert up.model.target == "/data/qwen" and up.model.num_speculative_tokens == 3
