"""The vLLM command line and environment each worker role gets."""

import json
from pathlib import Path

import pytest

from pdspec.settings import DecodeWorkerSettings, ModelSettings, PrefillWorkerSettings, WorkerSettings
from pdspec.worker import launch


def option(argv, name):
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("role, kv_role", [("prefill", "kv_producer"), ("decode", "kv_consumer")])
def test_roles_get_their_nixl_role_and_the_same_drafter(role, kv_role):
    model = ModelSettings(models_dir=Path("/m"))
    argv = launch.vllm_argv(role, model, launch.ROLE_SETTINGS[role](), cpu=True)
    # A decode worker recomputes a prompt whose KV pull failed (its prefill worker died).
    recompute = {"kv_load_failure_policy": "recompute"} if role == "decode" else {}
    # The same KV lease on both roles: the prefill worker keeps KV that long, the decode
    # worker renews it (heartbeats) and trusts it for half of it (decode_worker/engine/stale_kv.py).
    assert json.loads(option(argv, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector",
        "kv_role": kv_role,
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {"kv_lease_duration": 120},
        **recompute,
    }
    env = launch.worker_env(role, launch.ROLE_SETTINGS[role](kv_lease_s=90), Path("/run"), cpu=True)
    assert env.get("PDSPEC_STALE_KV_AFTER_S") == ("45" if role == "decode" else None)
    assert json.loads(option(argv, "--speculative-config")) == {
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "model": "/m/eagle3",
    }
    assert option(argv, "--model") == "/m/target"
    assert option(argv, "--served-model-name") == "pdspec-tiny"
    assert "--enable-prompt-tokens-details" in argv  # the proxy's cached_tokens come from it


@pytest.mark.parametrize("transfer, connector", [("pull", "NixlConnector"), ("push", "NixlPushConnector")])
def test_kv_transfer_names_vllms_connector_for_its_direction(transfer, connector):
    """kv_transfer = push is vLLM's NixlPushConnector on both roles (the one-GPU profile's:
    with no NVLink peer, UCX serves a pull's READ over TCP)."""
    import vllm.distributed.kv_transfer.kv_connector.factory as factory

    for role in ("prefill", "decode"):
        model = ModelSettings(models_dir=Path("/m"), kv_transfer=transfer)  # set once for the pair
        argv = launch.vllm_argv(role, model, launch.ROLE_SETTINGS[role](), cpu=True)
        config = json.loads(option(argv, "--kv-transfer-config"))
        assert config["kv_connector"] == connector
        assert connector in factory.KVConnectorFactory._registry  # a name vLLM itself registers


def test_gpu_build_uses_cuda_kv_buffer_and_memory_share():
    worker = DecodeWorkerSettings(gpu_memory_utilization=0.4, enforce_eager=False)
    argv = launch.vllm_argv("decode", ModelSettings(target="/q/Qwen3-8B", drafter="/q/eagle3"), worker, cpu=False)
    assert json.loads(option(argv, "--kv-transfer-config"))["kv_buffer_device"] == "cuda"
    assert option(argv, "--gpu-memory-utilization") == "0.4"
    assert "--enforce-eager" not in argv
    assert option(argv, "--served-model-name") == "/q/Qwen3-8B"


def test_colocated_has_no_kv_transfer():
    argv = launch.vllm_argv("colocated", ModelSettings(), WorkerSettings(), cpu=True)
    assert "--kv-transfer-config" not in argv


def test_dflash_profile_without_local_drafter():
    model = ModelSettings(target="/q/t", drafter="/q/dflash", method="dflash", num_speculative_tokens=16)
    spec = launch.speculative_config(model, "/q/dflash")
    assert spec == {"method": "dflash", "num_speculative_tokens": 16, "model": "/q/dflash"}


def test_environment_sets_side_channel_caches_and_idle_fix(tmp_path):
    worker = PrefillWorkerSettings(side_channel_port=5612, nixl_progress_delay_us=250, cpu_omp_threads_bind="1")
    env = launch.worker_env("prefill", worker, tmp_path, cpu=True)
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5612"
    assert env["PDSPEC_NIXL_PROGRESS_DELAY_US"] == "250"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path))
    assert env["PROMETHEUS_MULTIPROC_DIR"].startswith(str(tmp_path))


def test_a_named_engine_cache_holds_both_caches_and_the_run_keeps_the_rest(tmp_path):
    shared = tmp_path / "shared-cache"
    for role, settings in (("prefill", PrefillWorkerSettings), ("decode", DecodeWorkerSettings)):
        env = launch.worker_env(role, settings(engine_cache_dir=shared), tmp_path / "run", cpu=True)
        assert env["VLLM_CACHE_ROOT"] == str(shared / "vllm-cache")
        assert env["TORCHINDUCTOR_CACHE_DIR"] == str(shared / "inductor-cache")
        assert env["PROMETHEUS_MULTIPROC_DIR"].startswith(str(tmp_path / "run" / role))


def test_environment_carries_the_engine_loop_settings(tmp_path):
    env = launch.worker_env("prefill", PrefillWorkerSettings(), tmp_path, cpu=True)
    assert env["PDSPEC_KV_HOLD_POLL_S"] == "0.2" and env["PDSPEC_SPIN_WINDOW_MS"] == "5"  # the defaults
    env = launch.worker_env("prefill", PrefillWorkerSettings(kv_hold_poll_s=0, spin_window_ms=0.5), tmp_path, cpu=True)
    assert env["PDSPEC_KV_HOLD_POLL_S"] == "0" and env["PDSPEC_SPIN_WINDOW_MS"] == "0.5"


def test_test_hooks_give_each_role_its_own_switch(tmp_path):
    prefill = launch.worker_env("prefill", PrefillWorkerSettings(test_hooks=True), tmp_path, cpu=True)
    decode = launch.worker_env("decode", DecodeWorkerSettings(test_hooks=True), tmp_path, cpu=True)
    assert prefill["PDSPEC_TEST_SKIP_DRAFTER_PREFILL_FILE"] == str(launch.skip_drafter_file(tmp_path, "prefill"))
    assert decode["PDSPEC_TEST_DUMP_DRAFTER_KV_DIR"] == str(launch.drafter_kv_dump_dir(tmp_path, "decode"))
    assert "PDSPEC_TEST_DUMP_DRAFTER_KV_DIR" not in prefill and "PDSPEC_TEST_SKIP_DRAFTER_PREFILL_FILE" not in decode
    for role, env in (("prefill", prefill), ("decode", decode)):
        assert env["PDSPEC_TEST_PAUSE_STEPS_FILE"] == str(launch.pause_steps_file(tmp_path, role))
    plain = launch.worker_env("decode", DecodeWorkerSettings(), tmp_path, cpu=True)
    assert not any(name.startswith("PDSPEC_TEST_") for name in plain)


@pytest.mark.parametrize("role", ["prefill", "decode", "colocated"])
def test_local_model_parses_hermes_tool_calls_on_every_role(role):
    """The local model's chat template writes tool calls as hermes does, so every role
    reads them back: the prefill worker would refuse tool_choice='auto' without a parser."""
    argv = launch.vllm_argv(role, ModelSettings(models_dir=Path("/m")), launch.ROLE_SETTINGS[role](), cpu=True)
    assert option(argv, "--tool-call-parser") == "hermes"
    assert "--enable-auto-tool-choice" in argv
    assert "--reasoning-parser" not in argv  # the local model does not think


def test_tool_settings_override_the_local_default_and_a_real_model_gets_none():
    """Auto tool choice follows the parser: a real model without one gets neither flag
    (vLLM refuses --enable-auto-tool-choice alone)."""
    off = ModelSettings(models_dir=Path("/m"), enable_auto_tool_choice=False, tool_call_parser="pythonic")
    argv = launch.vllm_argv("decode", off, DecodeWorkerSettings(), cpu=True)
    assert option(argv, "--tool-call-parser") == "pythonic" and "--enable-auto-tool-choice" not in argv
    real = launch.vllm_argv(
        "decode", ModelSettings(target="/q/Qwen3-8B", drafter="/q/e"), DecodeWorkerSettings(), cpu=False
    )
    assert "--tool-call-parser" not in real and "--enable-auto-tool-choice" not in real


def test_reasoning_parser_reaches_both_workers():
    model = ModelSettings(models_dir=Path("/m"), reasoning_parser="granite")
    for role in ("prefill", "decode"):
        assert (
            option(launch.vllm_argv(role, model, launch.ROLE_SETTINGS[role](), cpu=True), "--reasoning-parser")
            == "granite"
        )


@pytest.mark.parametrize("role", ["prefill", "decode", "colocated"])
def test_local_model_writes_compact_json_and_constrains_tool_arguments(role, tmp_path):
    """Greedy, the tiny model fills a JSON object with newlines until max_tokens; inside
    vLLM's tool-call envelope whitespace cannot be turned off, so a named tool call gets
    the arguments' schema alone (and compact JSON), on every role alike."""
    model = ModelSettings(models_dir=Path("/m"))
    argv = launch.vllm_argv(role, model, launch.ROLE_SETTINGS[role](), cpu=True)
    # Key by key, so that a user's own `--structured-outputs-config.x` adds to them.
    assert option(argv, "--structured-outputs-config.backend") == "xgrammar"
    assert option(argv, "--structured-outputs-config.disable_any_whitespace") == "true"
    assert (
        launch.launch_spec(role, model, launch.ROLE_SETTINGS[role](), tmp_path).env["VLLM_ENFORCE_STRICT_TOOL_CALLING"]
        == "0"
    )


def test_a_real_model_keeps_vllms_grammar_defaults_unless_set(tmp_path):
    real = ModelSettings(target="/q/Qwen3-8B", drafter="/q/e")
    assert not any(
        "structured-outputs" in flag for flag in launch.vllm_argv("decode", real, DecodeWorkerSettings(), cpu=False)
    )
    assert "VLLM_ENFORCE_STRICT_TOOL_CALLING" not in launch.tool_call_env(real)
    chosen = real.model_copy(update={"compact_json": True, "tool_call_grammar": "envelope"})
    assert option(
        launch.vllm_argv("decode", chosen, DecodeWorkerSettings(), cpu=False), "--structured-outputs-config.backend"
    )
    assert launch.tool_call_env(chosen) == {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "1"}
    local_off = ModelSettings(models_dir=Path("/m"), compact_json=False, tool_call_grammar="envelope")
    assert not any(
        "structured-outputs" in flag for flag in launch.vllm_argv("decode", local_off, DecodeWorkerSettings(), cpu=True)
    )
    assert (
        launch.launch_spec("decode", local_off, DecodeWorkerSettings(), tmp_path).env[
            "VLLM_ENFORCE_STRICT_TOOL_CALLING"
        ]
        == "1"
    )


def test_auto_tool_choice_is_a_plain_cli_flag():
    from pydantic_settings import CliApp

    from pdspec.settings import UpCommand

    assert CliApp.run(UpCommand, cli_args=["--model.enable_auto_tool_choice"]).model.enable_auto_tool_choice
    assert not CliApp.run(UpCommand, cli_args=["--no-model.enable_auto_tool_choice"]).model.enable_auto_tool_choice


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_workers_serve_the_scale_out_api_by_default(role):
    """The proxy's cache-aware routing reads Responses and Messages token ids from the
    workers' render endpoints (proxy/routing/tokens.py)."""
    assert "--enable-scale-out" in launch.vllm_argv(role, ModelSettings(), launch.ROLE_SETTINGS[role](), cpu=True)
    off = launch.vllm_argv(role, ModelSettings(), launch.ROLE_SETTINGS[role](scale_out_api=False), cpu=True)
    assert "--enable-scale-out" not in off


def test_a_colocated_server_has_no_scale_out_api():
    # Clients reach it directly: render and /inference/v1/generate stay off there.
    assert "--enable-scale-out" not in launch.vllm_argv("colocated", ModelSettings(), WorkerSettings(), cpu=True)


def test_server_options_are_all_that_an_engine_would_not_take():
    """loadtest.engine_bench builds an offline engine from `engine_options` minus
    SERVER_OPTIONS: whatever is left must be an EngineArgs field, or `vllm.LLM` refuses it."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    model = ModelSettings(tool_call_parser="hermes", enable_auto_tool_choice=True, reasoning_parser="qwen3")
    for role in ("prefill", "decode"):
        worker = launch.ROLE_SETTINGS[role](max_num_batched_tokens=512, max_num_seqs=8)
        options = launch.engine_options(role, model, worker, cpu=True)
        assert {name for name in options if name not in launch.SERVER_OPTIONS} <= fields
        assert "enable_scale_out" in options and "enable_scale_out" not in fields


def test_vllms_parser_keeps_pdspecs_grammar_keys_beside_a_users_own():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    worker = DecodeWorkerSettings(extra_vllm_args=["--structured-outputs-config.enable_in_reasoning", "true"])
    argv = launch.vllm_argv("decode", ModelSettings(models_dir=Path("/m")), worker, cpu=True)
    config = make_arg_parser(FlexibleArgumentParser()).parse_args(argv).structured_outputs_config
    assert (config.backend, config.disable_any_whitespace, config.enable_in_reasoning) == ("xgrammar", True, True)


def test_a_worker_is_launched_from_its_roles_settings():
    """A prefill worker's engine features read settings only PrefillWorkerSettings has; a
    decode worker's KV-load failure policy only DecodeWorkerSettings: the launcher refuses
    the other class rather than leave them at some default."""
    with pytest.raises(TypeError, match="a prefill worker's settings are PrefillWorkerSettings"):
        launch.worker_env("prefill", WorkerSettings(), Path("/run"), cpu=True)
    with pytest.raises(TypeError, match="a decode worker's settings are DecodeWorkerSettings"):
        launch.vllm_argv("decode", ModelSettings(), PrefillWorkerSettings(), cpu=True)
    decode = launch.worker_env("decode", DecodeWorkerSettings(), Path("/run"), cpu=True)
    assert "PDSPEC_KV_HOLD_POLL_S" not in decode and "PDSPEC_KV_ONLY_DRAFTER" not in decode
