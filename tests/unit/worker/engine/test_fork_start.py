"""fork_start: on CPU builds vLLM's engine-core and worker processes are forked, not spawned:
vLLM's CPU platform still sets everything it sets, then the start method is fork. On
vLLM's own CpuPlatform."""

import os

import pytest

from pdspec.worker.engine import features, fork_start
from pdspec.worker.engine.fork_start import MARKER, START_METHOD_ENV
from pdspec.worker.engine.wrap_once import is_wrapped


@pytest.fixture
def cpu_platform(monkeypatch):
    cpu = pytest.importorskip("vllm.platforms.cpu")
    original = cpu.CpuPlatform.__dict__["check_and_update_config"]
    monkeypatch.setattr(cpu.CpuPlatform, "check_and_update_config", original)  # restored after the test
    monkeypatch.delenv(fork_start.FORK_START_ENV, raising=False)
    monkeypatch.setenv(START_METHOD_ENV, "unset-by-test")  # restored after the test
    return cpu.CpuPlatform


def test_the_platform_sets_spawn_and_the_feature_turns_it_to_fork(cpu_platform, monkeypatch):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the CPU build's test; a GPU build spawns (next tests)")
    calls = []
    # vLLM's own method needs a whole VllmConfig; this stand-in does its part that matters
    # here, as the class's own classmethod.
    monkeypatch.setattr(
        cpu_platform,
        "check_and_update_config",
        classmethod(lambda cls, config: (calls.append((cls, config)), os.environ.update({START_METHOD_ENV: "spawn"}))),
    )
    fork_start.install_fork_start()
    fork_start.install_fork_start()  # idempotent
    assert is_wrapped(cpu_platform.check_and_update_config, MARKER)
    cpu_platform.check_and_update_config("config")
    assert calls == [(cpu_platform, "config")]  # the platform's own ran, on its class
    assert os.environ[START_METHOD_ENV] == "fork"
    assert features.reported()[features.FORK_START] == ("on", "")


def test_the_setting_off_leaves_vllms_spawn(cpu_platform, monkeypatch):
    monkeypatch.setenv(fork_start.FORK_START_ENV, "0")
    fork_start.install_fork_start()
    assert not is_wrapped(cpu_platform.check_and_update_config, MARKER)
    assert features.reported()[features.FORK_START] == ("off", f"off by setting ({fork_start.FORK_START_ENV}=0)")


def test_a_gpu_build_spawns(cpu_platform, monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    fork_start.install_fork_start()
    assert not is_wrapped(cpu_platform.check_and_update_config, MARKER)
    assert features.reported()[features.FORK_START][0] == "off"
