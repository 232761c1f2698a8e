import subprocess
import sys

from pydantic_settings import CliApp

from pdspec.settings import UpCommand, WorkerCommand


def test_up_defaults_give_each_worker_its_own_ports_and_core():
    up = CliApp.run(UpCommand, cli_args=[])
    assert (up.prefill.port, up.decode.port, up.proxy.port) == (8100, 8200, 8000)
    assert up.prefill.side_channel_port != up.decode.side_channel_port
    assert (up.prefill.cpu_omp_threads_bind, up.decode.cpu_omp_threads_bind) == ("0", "1")


def test_cli_and_env_use_the_same_names(monkeypatch):
    monkeypatch.setenv("PDSPEC_DECODE__PORT", "9200")
    monkeypatch.setenv("PDSPEC_MODEL__NUM_SPECULATIVE_TOKENS", "5")
    up = CliApp.run(UpCommand, cli_args=["--prefill.port", "9100"])
    assert up.prefill.port == 9100
    assert up.decode.port == 9200
    assert up.model.num_speculative_tokens == 5
    # A partial override keeps the role's other defaults.
    assert up.prefill.side_channel_port == 5600 and up.decode.cpu_omp_threads_bind == "1"


def test_cli_wins_over_env(monkeypatch):
    monkeypatch.setenv("PDSPEC_WORKER__PORT", "1")
    worker = CliApp.run(WorkerCommand, cli_args=["--worker.port", "2"])
    assert worker.worker.port == 2


def test_toml_file(monkeypatch, tmp_path):
    config = tmp_path / "pdspec.toml"
    config.write_text('[model]\ntarget = "/models/x"\nnum_speculative_tokens = 16\n[decode]\nport = 7000\n')
    monkeypatch.setenv("PDSPEC_CONFIG", str(config))
    up = CliApp.run(UpCommand, cli_args=[])
    assert up.model.target == "/models/x" and up.model.num_speculative_tokens == 16
    assert up.decode.port == 7000


def test_invalid_values_are_rejected_by_the_cli_with_the_option_named():
    result = subprocess.run(
        [sys.executable, "-m", "pdspec.cli", "up", "--prefill.drafts", "sometimes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--prefill.drafts" in result.stderr


def test_kv_source_ports_are_checked_and_up_adds_its_prefill_side_channel():
    import pytest
    from pydantic import ValidationError

    from pdspec.settings import ProxySettings
    from pdspec.supervisor import proxy_settings_for

    assert ProxySettings(kv_source_ports=["5600", "7000-7010"]).kv_source_ports == ["5600", "7000-7010"]
    for bad in ("x", "7010-7000", "0", "70000", "1-2-3", "-5"):
        with pytest.raises(ValidationError):
            ProxySettings(kv_source_ports=[bad])
    up = CliApp.run(UpCommand, cli_args=["--prefill.side_channel_port", "18300", "--proxy.kv_source_ports", '["9000"]'])
    assert proxy_settings_for(up).kv_source_ports == ["9000", "18300"]


def test_every_proxy_setting_is_described():
    """vLLM documents every config field; `pdspec proxy --help` shows these."""
    from pdspec.settings import ProxySettings

    assert [name for name, field in ProxySettings.model_fields.items() if not field.description] == []


def test_role_commands_default_to_their_roles_ports():
    from pdspec.settings import DecodeCommand, PrefillCommand

    prefill, decode = CliApp.run(PrefillCommand, cli_args=[]), CliApp.run(DecodeCommand, cli_args=[])
    assert (prefill.worker.port, prefill.worker.side_channel_port, prefill.worker.kv_events_port) == (8100, 5600, 5650)
    assert (decode.worker.port, decode.worker.side_channel_port, decode.worker.kv_events_port) == (8200, 5700, 5750)
