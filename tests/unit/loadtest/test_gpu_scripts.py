"""The GPU machine's scripts (loadtest/gpu/) cannot run here, and a device call is too
dear to find a typo in: they must at least parse, and every file of this repository
they name must exist."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted((ROOT / "loadtest" / "gpu").glob("*.sh"))
# A repository path a script names: deploy/... or loadtest/..., up to a space or quote.
REPO_PATH = re.compile(r"\b(?:deploy|loadtest)/[A-Za-z0-9_./-]*[A-Za-z0-9_]")


def test_there_are_gpu_scripts():
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_paths_the_script_names_exist(script):
    named = set(REPO_PATH.findall(script.read_text()))
    # "deploy/profiles/dummy/qwen3-8b-$x.toml": a prefix completed at run time
    missing = [p for p in named if not (ROOT / p).exists() and not list(ROOT.glob(p + "*"))]
    assert not missing, missing


def gpu_args(*call: str, dry_run: bool) -> list[str]:
    """GPU_ARGS after `one_gpu_pair *call` (device_env.sh sourced as a dry run, which is
    all this machine can do, then the dry run left on or switched off)."""
    script = (
        f"source loadtest/gpu/device_env.sh 1 dry-run-ok && DRY_RUN={'1' if dry_run else ''} && "
        f"one_gpu_pair {' '.join(call)} && printf '%s\\n' \"${{GPU_ARGS[@]}}\""
    )
    result = subprocess.run(
        ["bash", "-uc", script],
        cwd=ROOT,
        env={"DRY_RUN_CPU": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_one_gpu_pair_puts_both_workers_on_gpu_0_and_nothing_on_a_dry_run():
    assert gpu_args("0.4", dry_run=True) == []
    assert gpu_args("0.4", dry_run=False) == [
        "--prefill.cuda_visible_devices",
        "0",
        "--decode.cuda_visible_devices",
        "0",
        "--prefill.gpu_memory_utilization",
        "0.4",
        "--decode.gpu_memory_utilization",
        "0.4",
    ]
    eager = gpu_args("0.1", "eager", dry_run=False)
    assert eager[-2:] == ["--prefill.enforce_eager", "--decode.enforce_eager"] and "0.1" in eager


def test_a_stray_dry_run_cpu_does_not_skip_the_gpu_check_of_a_script_without_a_dry_run():
    """Sourced without `dry-run-ok`, device_env.sh checks for vLLM and GPUs whatever
    DRY_RUN_CPU says: here, with neither, it stops the script."""

    def source(*args: str) -> subprocess.CompletedProcess:
        script = f"source loadtest/gpu/device_env.sh {' '.join(args)} && echo past-the-check"
        env = {"DRY_RUN_CPU": "1", "PATH": "/usr/bin:/bin"}
        return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)

    stray = source("1")
    assert stray.returncode != 0 and "past-the-check" not in stray.stdout
    dry = source("1", "dry-run-ok")
    assert dry.returncode == 0 and "past-the-check" in dry.stdout


def test_the_scripts_that_say_they_have_a_dry_run_ask_device_env_for_it():
    says = {s.name for s in SCRIPTS if "DRY_RUN_CPU=1" in s.read_text() and s.name != "device_env.sh"}
    asks = {s.name for s in SCRIPTS if "device_env.sh 1 dry-run-ok" in s.read_text()}
    assert says == asks and len(asks) >= 5


def fleet_args(dry_run: bool, **env: str) -> list[str]:
    """FLEET_ARGS after sourcing fleet_shape.sh (NUL after each: --up-args spans lines)."""
    script = f"DRY_RUN={'1' if dry_run else ''} && source loadtest/gpu/fleet_shape.sh && printf '%s\\0' \"${{FLEET_ARGS[@]}}\""
    result = subprocess.run(
        ["bash", "-uc", script],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": "/home/x", **env},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\0")[:-1]


def test_the_fleet_shape_is_the_fleet_fleet_h200_ran_before_it_was_shared():
    """fleet_h200.sh's fleet, moved into fleet_shape.sh for client_check_h200.sh: the same
    fleet_bench flags as the runs under loadtest/results/fleet/h200-qwen3-8b had."""
    args = fleet_args(dry_run=False)
    up = args[args.index("--up-args") + 1].split()
    assert args[: args.index("--up-args")] == [
        "--model",
        "Qwen3-8B-dummy",
        "--prefill-replicas",
        "2",
        "--decode-replicas",
        "2",
        "--kv-blocks",
        "2048",
        "--block-size",
        "16",
        "--kv-bytes-per-token",
        "151552",
        "--extra-vllm-args",
        '["--load-format", "dummy"]',
    ]
    assert up[:2] == ["--model.target", "deploy/shapes/qwen3-8b-v4096"] and "--prefill.enforce_eager" in up
    assert up[up.index("--model.served_model_name") + 1] == "Qwen3-8B-dummy"
    assert fleet_args(dry_run=False, PREFILL="3", DECODE="1")[3:6] == ["3", "--decode-replicas", "1"]


def test_a_dry_run_fleet_is_the_local_model_and_base_port_moves_every_port():
    args = fleet_args(dry_run=True, BASE_PORT="19000")
    assert args[args.index("--model") + 1] == "pdspec-tiny" and "--kv-bytes-per-token" not in args
    ports = {flag: args[args.index(flag) + 1] for flag in args if flag.endswith("-port")}
    assert ports == {
        "--base-port": "19000",
        "--prefill-port": "19100",
        "--decode-port": "19200",
        "--side-channel-port": "19600",
        "--kv-events-port": "19650",
    }
    assert "--model.models_dir /home/x/.cache/pdspec/models" in args[args.index("--up-args") + 1]
    assert not [a for a in fleet_args(dry_run=False) if a.endswith("-port")]  # fleet_bench's defaults


def test_require_modules_stops_before_anything_starts_and_names_the_wheels_to_carry():
    """A module the staged vLLM does not bring (simpy: a plan check once ran its whole load,
    then could not simulate) stops the script at once, naming the pip download to carry;
    modules that import pass."""

    def require(*modules: str) -> subprocess.CompletedProcess:
        script = (
            "source loadtest/gpu/device_env.sh 1 dry-run-ok && "
            f"require_modules {' '.join(modules)} && echo past-the-check"
        )
        env = {"DRY_RUN_CPU": "1", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
        return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)

    missing = require("json", "no_such_module_pdspec", "another_missing_one")
    assert missing.returncode == 1 and "past-the-check" not in missing.stdout
    assert "no_such_module_pdspec another_missing_one" in missing.stderr and "pip download" in missing.stderr
    assert "json" not in missing.stderr.split("missing Python modules:")[1].split(";")[0]
    present = require("json", "simpy")
    assert present.returncode == 0 and "past-the-check" in present.stdout, present.stderr


def test_the_plan_check_requires_the_fleet_models_simpy_before_it_starts_the_stack():
    text = (ROOT / "loadtest/gpu/plan_check_h200.sh").read_text()
    assert text.index("require_modules simpy") < text.index("pdspec.cli")
