import os
import subprocess
import sys
from pathlib import Path

from pydantic_settings import CliApp

from pdspec.settings import UpCommand, WorkerCommand

REPO = Path(__file__).resolve().parents[2]


def pdspec_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`pdspec ARGS` in a process of its own (with `env` over this one's), its output kept."""
    return subprocess.run(
        [sys.executable, "-m", "pdspec.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


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
    result = pdspec_cli("up", "--prefill.drafts", "sometimes")
    assert result.returncode == 2
    assert "--prefill.drafts" in result.stderr


def test_kv_source_ports_are_checked_and_up_adds_its_prefill_side_channel():
    import pytest
    from pydantic import ValidationError

    from pdspec.settings import ProxySettings
    from pdspec.supervisor import proxy_settings_for

    ports = ["5600", "7000-7010"]
    assert ProxySettings(kv_transfer={"source_ports": ports}).kv_transfer.source_ports == ports
    for bad in ("x", "7010-7000", "0", "70000", "1-2-3", "-5"):
        with pytest.raises(ValidationError):
            ProxySettings(kv_transfer={"source_ports": [bad]})
    up = CliApp.run(
        UpCommand, cli_args=["--prefill.side_channel_port", "18300", "--proxy.kv_transfer.source_ports", '["9000"]']
    )
    assert proxy_settings_for(up).kv_transfer.source_ports == ["9000", "18300"]
    assert up.proxy.kv_transfer.source_ports == ["9000"]  # the settings given are left as they were


def test_every_proxy_setting_is_described():
    """vLLM documents every config field; `pdspec proxy --help` shows these."""
    from pdspec.settings import ProxySettings
    from pdspec.settings_reference import directly_nested

    undescribed, todo = [], [("", ProxySettings)]
    while todo:
        prefix, model = todo.pop()
        assert model.__doc__, model
        for name, field in model.model_fields.items():
            undescribed += [] if field.description else [prefix + name]
            if (nested := directly_nested(field.annotation)) is not None:
                todo.append((f"{prefix}{name}.", nested))
    assert undescribed == []


# --- Settings in groups (issue 40): each spelling follows the nesting --------------------


def test_proxy_groups_nest_on_the_cli_in_the_environment_and_in_toml(monkeypatch, tmp_path):
    from pdspec.settings import ProxyCommand

    config = tmp_path / "pdspec.toml"
    config.write_text("[proxy.health]\ninterval_s = 7.5\n[proxy.admission]\nprefill_kv = true\n")
    monkeypatch.setenv("PDSPEC_CONFIG", str(config))
    monkeypatch.setenv("PDSPEC_PROXY__RETRIES__DECODE_RETRIES", "3")
    monkeypatch.setenv("PDSPEC_PROXY", '{"worker_client": {"prefill_timeout_s": 9}}')
    proxy = CliApp.run(ProxyCommand, cli_args=["--proxy.routing.decode_policy", "kv_aware"]).proxy
    assert proxy.routing.decode_policy == "kv_aware"
    assert proxy.retries.decode_retries == 3
    assert proxy.worker_client.prefill_timeout_s == 9
    assert proxy.health.interval_s == 7.5 and proxy.admission.prefill_kv is True
    # A partial group keeps the group's other defaults.
    assert proxy.health.timeout_s == 2.0 and proxy.routing.prefill_policy == "prefix_affinity"


def test_a_flat_proxy_key_of_before_the_groups_is_refused():
    import pytest
    from pydantic import ValidationError

    from pdspec.settings import ProxySettings

    for old in ({"decode_retries": 0}, {"health_interval_s": 1}, {"routing": {"routing_tokenize_timeout_s": 1}}):
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            ProxySettings(**old)
    result = pdspec_cli("proxy", env={"PDSPEC_PROXY__HEALTH_INTERVAL_S": "1"})
    assert result.returncode == 2
    assert "--proxy.health_interval_s: no such setting for `pdspec proxy`" in result.stderr


def test_a_decode_worker_refuses_a_prefill_workers_setting():
    import pytest
    from pydantic import ValidationError

    from pdspec.settings import DecodeCommand, DecodeWorkerSettings, PrefillWorkerSettings

    for field in ("kv_only_drafter", "kv_hold_poll_s", "dp_idle_rank_vote"):
        assert field in PrefillWorkerSettings.model_fields
        with pytest.raises(ValidationError, match=f"decode.{field}\n  Extra inputs are not permitted"):
            UpCommand(decode={field: PrefillWorkerSettings.model_fields[field].default})
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            DecodeWorkerSettings(**{field: PrefillWorkerSettings.model_fields[field].default})
    with pytest.raises(SystemExit):  # not an option of `pdspec decode` at all
        CliApp.run(DecodeCommand, cli_args=["--worker.kv_hold_poll_s", "0"])
    # and the other way round
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        UpCommand(prefill={"kv_load_failure_policy": "fail"})
    # On the command line it is no option at all; in the environment (or a TOML file) it is named.
    result = pdspec_cli("up", "--decode.kv_only_drafter", "false")
    assert result.returncode == 2 and "unrecognized arguments: --decode.kv_only_drafter" in result.stderr
    result = pdspec_cli("up", env={"PDSPEC_DECODE__KV_ONLY_DRAFTER": "false"})
    assert result.returncode == 2
    assert "--decode.kv_only_drafter: no such setting for `pdspec up`" in result.stderr


def test_the_kv_transfer_mode_is_set_once_for_the_pair():
    import pytest
    from pydantic import ValidationError

    from pdspec.worker.launch import KV_CONNECTORS, kv_transfer_config

    up = CliApp.run(UpCommand, cli_args=["--model.kv_transfer", "push"])
    assert up.model.kv_transfer == "push"
    for role, worker in (("prefill", up.prefill), ("decode", up.decode)):
        assert kv_transfer_config(role, up.model.kv_transfer, worker, cpu=True)["kv_connector"] == KV_CONNECTORS["push"]
    for role in ("prefill", "decode", "colocated"):
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            UpCommand(**{role: {"kv_transfer": "push"}})


def test_role_commands_default_to_their_roles_ports():
    from pdspec.settings import DecodeCommand, PrefillCommand

    prefill, decode = CliApp.run(PrefillCommand, cli_args=[]), CliApp.run(DecodeCommand, cli_args=[])
    assert (prefill.worker.port, prefill.worker.side_channel_port, prefill.worker.kv_events_port) == (8100, 5600, 5650)
    assert (decode.worker.port, decode.worker.side_channel_port, decode.worker.kv_events_port) == (8200, 5700, 5750)


# --- The e2e suite's settings, checked without starting anything ----------------------------
# The e2e modules start proxies with `harness.start_proxy(port, routing={...}, ...)` (and
# helpers that pass their keywords on) and stacks with `--proxy.<group>.<field>` options;
# they run for minutes, so a setting of before the groups would only fail there, late. Here
# every such call site and option is read from the source and checked against the models.

E2E_SOURCES = sorted(
    [*(REPO / "tests" / "e2e").glob("*.py"), *(REPO / "tests").glob("*.py"), *(REPO / "loadtest").rglob("*.py")]
)
PROXY_CALLS = {"start_proxy", "early_proxy", "through_proxy"}
NOT_SETTINGS = {"log_path", "while_up"}  # the helpers' own arguments


def _settings_errors(keys: dict, model, where: str) -> list[str]:
    """Errors of a settings dict literal's key structure against `model` ({key: value node})."""
    import ast

    from pdspec.settings_reference import directly_nested

    errors = []
    for key, value in keys.items():
        if key not in model.model_fields:
            errors.append(f"{where}: {key} is no field of {model.__name__}")
            continue
        nested = directly_nested(model.model_fields[key].annotation)
        if nested is not None and isinstance(value, ast.Dict):
            inner = {k.value: v for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant)}
            errors += _settings_errors(inner, nested, f"{where}.{key}")
    return errors


def _option_errors(path: list[str], model, where: str) -> list[str]:
    from pdspec.settings_reference import directly_nested

    name, rest = path[0], path[1:]
    if name not in model.model_fields:
        return [f"{where}: {name} is no field of {model.__name__}"]
    nested = directly_nested(model.model_fields[name].annotation)
    if rest and nested is None:
        return [f"{where}: {name} has no fields"]
    return _option_errors(rest, nested, where) if rest else []


def test_the_e2e_suites_proxy_settings_and_options_name_fields_where_they_are():
    import ast
    import re

    from pdspec.settings import ProxySettings

    # `--proxy.routing.prefill_policy`, `--no-prefill.kv_only_drafter`, or `--set`'s `model.kv_transfer=push`
    option = re.compile(
        r"^(?:--(?:no-)?(?=\w+\.[\w.]+$)|(?=\w+\.[\w.]+=))(proxy|prefill|decode|model|colocated)\.([\w.]+)"
    )
    errors, calls, options = [], 0, 0
    for path in E2E_SOURCES:
        tree = ast.parse(path.read_text())
        where = str(path.relative_to(REPO))
        for node in ast.walk(tree):
            name = getattr(node, "func", None)
            name = getattr(name, "attr", None) or getattr(name, "id", None)
            if isinstance(node, ast.Call) and name in PROXY_CALLS:
                calls += 1
                keys = {k.arg: k.value for k in node.keywords if k.arg and k.arg not in NOT_SETTINGS}
                errors += _settings_errors(keys, ProxySettings, f"{where}:{node.lineno}")
            elif isinstance(node, ast.Dict) and node.keys:
                keys = {k.value: v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}
                groups = {"routing", "retries", "worker_client", "health", "admission", "clients", "observability"}
                if groups & set(keys) and all(isinstance(k, str) for k in keys):
                    errors += _settings_errors(keys, ProxySettings, f"{where}:{node.lineno}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := option.match(node.value)):
                options += 1
                errors += _option_errors([m.group(1), *m.group(2).split(".")], UpCommand, f"{where}:{node.lineno}")
    assert calls > 20 and options > 20
    assert errors == []


def test_the_e2e_modules_proxy_setting_constants_validate():
    """Module-level proxy settings (the routing fleets' ROUTING) validate as they are, values too."""
    import importlib

    from pdspec.settings import ProxySettings

    groups = set(ProxySettings.model_fields) - {"host", "port", "prefill_urls", "decode_urls"}
    checked = 0
    for path in sorted((REPO / "tests" / "e2e").glob("test_*.py")):
        module = importlib.import_module(f"tests.e2e.{path.stem}")
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, dict) and value and groups >= set(value):
                ProxySettings.model_validate(value)
                checked += 1
    assert checked >= 2


# --- proxy.workers: the proxy as several processes on one port (proxy/processes.py) -------


def test_the_proxy_is_one_process_unless_told_and_never_none():
    import pytest
    from pydantic import ValidationError

    from pdspec.settings import ProxySettings

    assert ProxySettings().workers == 1
    for workers in (0, -2):
        with pytest.raises(ValidationError, match="greater than or equal to 1"):
            ProxySettings(workers=workers)


def test_each_of_the_proxys_processes_needs_a_share_of_its_limits_and_one_port():
    import pytest
    from pydantic import ValidationError

    from pdspec.settings import ProxySettings

    ProxySettings(workers=4, admission={"max_inflight": 4}, clients={"max_connections": 4})
    with pytest.raises(ValidationError, match=r"admission.max_inflight \(3\) is divided among the 4 workers"):
        ProxySettings(workers=4, admission={"max_inflight": 3})
    with pytest.raises(ValidationError, match=r"clients.max_connections \(2\) is divided among the 4 workers"):
        ProxySettings(workers=4, clients={"max_connections": 2})
    with pytest.raises(ValidationError, match="port 0"):
        ProxySettings(workers=2, port=0)
    ProxySettings(workers=1, port=0, admission={"max_inflight": 1})  # one process: as before
