"""The ready-made GPU profiles load and give the seed workloads' vLLM settings."""

import json
from pathlib import Path

import pytest
import tomllib
from pydantic_settings import CliApp

from pdspec.settings import UpCommand
from pdspec.worker.launch import KV_ROLES, ROLE_SETTINGS, scheduler_cls, vllm_argv, worker_env

PROFILES = Path(__file__).resolve().parents[3] / "deploy" / "profiles"


def load(monkeypatch, name) -> UpCommand:
    monkeypatch.setenv("PDSPEC_CONFIG", str(PROFILES / name))
    return CliApp.run(UpCommand, cli_args=[])


@pytest.mark.parametrize(
    "name, method, k", [("qwen3-8b-eagle3.toml", "eagle3", 3), ("qwen3-8b-dflash.toml", "dflash", 16)]
)
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


SHAPES = PROFILES.parents[0] / "shapes"
REPO = PROFILES.parents[1]
DUMMY = [("qwen3-8b-eagle3", "eagle3", 3), ("qwen3-8b-dflash", "dflash", 16)]


def _config(path: str) -> dict:
    return json.loads((REPO / path / "config.json").read_text())


@pytest.mark.parametrize("name, method, k", DUMMY)
def test_dummy_1p1d_profiles_run_the_shapes_with_random_weights(monkeypatch, tmp_path, name, method, k):
    up = load(monkeypatch, f"dummy/{name}-1p1d.toml")
    assert up.layout == "1p1d"
    for role, worker, gpu in (("prefill", up.prefill, "0"), ("decode", up.decode, "1")):
        argv = vllm_argv(role, up.model, worker, cpu=False)
        assert argv[argv.index("--model") + 1] == "deploy/shapes/qwen3-8b-v4096"
        assert argv[argv.index("--load-format") + 1] == "dummy"
        assert "--enforce-eager" not in argv and "--dtype" not in argv  # compiled, the shapes' bf16
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert (spec["method"], spec["num_speculative_tokens"], spec["model"]) == (method, k, up.model.drafter)
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_role"] == KV_ROLES[role]
        assert argv[argv.index("--scheduler-cls") + 1] == scheduler_cls(role)
        assert worker_env(role, worker, tmp_path, cpu=False)["CUDA_VISIBLE_DEVICES"] == gpu
    prefill = vllm_argv("prefill", up.model, up.prefill, cpu=False)
    assert prefill[prefill.index("--max-num-batched-tokens") + 1] == "512"


@pytest.mark.parametrize("name, method, k", DUMMY)
def test_dummy_colocated_profiles_start_one_server(monkeypatch, name, method, k):
    from pdspec.supervisor import client_url

    up = load(monkeypatch, f"dummy/{name}-colocated.toml")
    assert up.layout == "colocated" and client_url(up) == "http://127.0.0.1:8000"
    argv = vllm_argv("colocated", up.model, up.colocated, cpu=False)
    assert "--kv-transfer-config" not in argv
    assert argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == k
    assert up.colocated.cuda_visible_devices == "0"
    # The real-weight twin differs only in paths and the dummy load format.
    real = load(monkeypatch, f"{name}-colocated.toml")
    assert real.layout == "colocated" and real.model.method == method and real.model.target.startswith("/models/")


def test_shapes_fit_the_shipped_tokenizer():
    target = _config("deploy/shapes/qwen3-8b-v4096")
    full = _config("deploy/shapes/qwen3-8b")
    assert target["vocab_size"] == 4096 and target["eos_token_id"] < 4096
    # Only the vocabulary differs from Qwen3-8B's shape: same compute per token.
    assert {
        k: v for k, v in target.items() if k not in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")
    } == {k: v for k, v in full.items() if k not in ("vocab_size", "bos_token_id", "eos_token_id")}
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (REPO / "deploy/shapes/qwen3-8b-v4096" / name).is_file(), name  # the links resolve
    tokenizer = json.loads((REPO / "deploy/shapes/qwen3-8b-v4096/tokenizer.json").read_text())
    assert (
        max(tokenizer["model"]["vocab"].values()) < 4096
        and target["eos_token_id"] == tokenizer["model"]["vocab"]["<|im_end|>"]
    )
    eagle = _config("deploy/shapes/qwen3-8b-eagle3-v4096")
    assert eagle["vocab_size"] == eagle["draft_vocab_size"] == 4096
    dflash = _config("deploy/shapes/qwen3-8b-dflash-v4096")
    assert dflash["vocab_size"] == 4096 and dflash["dflash_config"]["mask_token_id"] < 4096
    assert max(dflash["dflash_config"]["target_layer_ids"]) < target["num_hidden_layers"] == dflash["num_target_layers"]


@pytest.mark.parametrize("vote, env_value", [([], "1"), (["--no-worker.dp_idle_rank_vote"], "0")])
def test_dp2_prefill_profile_spans_both_gpus_with_the_vote_switch(monkeypatch, tmp_path, vote, env_value):
    from pdspec.settings import PrefillCommand
    from pdspec.worker.engine.control import DP_IDLE_RANK_VOTE_ENV

    monkeypatch.setenv("PDSPEC_CONFIG", str(PROFILES / "dummy" / "qwen3-30b-a3b-eagle3-prefill-dp2.toml"))
    command = CliApp.run(PrefillCommand, cli_args=vote)  # `pdspec prefill`
    argv = vllm_argv("prefill", command.model, command.worker, cpu=False)
    assert argv[argv.index("--data-parallel-size") + 1] == "2"
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_role"] == KV_ROLES["prefill"]
    env = worker_env("prefill", command.worker, tmp_path, cpu=False)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env[DP_IDLE_RANK_VOTE_ENV] == env_value
    # vLLM steps the data-parallel ranks together (and so votes) only for MoE models
    target, drafter = _config(command.model.target), _config(command.model.drafter)
    assert target["num_experts"] > 1 and target["architectures"] == ["Qwen3MoeForCausalLM"]
    assert drafter["hidden_size"] == drafter["target_hidden_size"] == target["hidden_size"]
    assert max(drafter["eagle_aux_hidden_state_layer_ids"]) < target["num_hidden_layers"]
    assert target["vocab_size"] == drafter["vocab_size"] == 4096


@pytest.mark.parametrize("profile", sorted(PROFILES.glob("qwen3-8b-*.toml")))
def test_qwen3_profiles_parse_tool_calls_and_thinking_on_every_worker(profile):
    from pdspec.settings import ModelSettings
    from pdspec.worker.launch import engine_options, option_flags

    model = ModelSettings(**tomllib.loads(profile.read_text())["model"])
    assert (model.tool_call_parser, model.enable_auto_tool_choice, model.reasoning_parser) == ("hermes", True, "qwen3")
    for role in ("prefill", "decode"):
        flags = option_flags(engine_options(role, model, ROLE_SETTINGS[role](), cpu=False))
        assert "--tool-call-parser" in flags and "--enable-auto-tool-choice" in flags and "--reasoning-parser" in flags
