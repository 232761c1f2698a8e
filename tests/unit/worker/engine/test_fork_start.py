"""fork_start: on CPU builds vLLM's engine-core process is forked from its API server; the
engine core's own executor still spawns the model worker (its OpenMP binding needs a fresh
process). On vLLM's own modules."""

import pytest

from pdspec.worker.engine import features, fork_start
from pdspec.worker.engine.fork_start import MARKER
from pdspec.worker.engine.wrap_once import is_wrapped


@pytest.fixture
def engine_utils(monkeypatch):
    utils = pytest.importorskip(fork_start.ENGINE_UTILS)
    monkeypatch.setattr(utils, "get_mp_context", utils.get_mp_context)  # restored after the test
    monkeypatch.delenv(fork_start.FORK_START_ENV, raising=False)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # as vLLM's CPU platform sets it
    return utils


def test_the_engine_core_is_forked_and_the_worker_still_spawned(engine_utils):
    from vllm.platforms import current_platform
    from vllm.v1.executor import multiproc_executor

    if not current_platform.is_cpu():
        pytest.skip("the CPU build's test; a GPU build spawns (next tests)")
    assert engine_utils.get_mp_context().get_start_method() == "spawn"  # vLLM's own on CPU
    fork_start.install_fork_start()
    fork_start.install_fork_start()  # idempotent
    assert is_wrapped(engine_utils.get_mp_context, MARKER)
    assert engine_utils.get_mp_context().get_start_method() == "fork"  # the engine core
    assert multiproc_executor.get_mp_context().get_start_method() == "spawn"  # its model worker
    assert features.reported()[features.FORK_START] == ("on", "")


def test_the_setting_off_leaves_vllms_spawn(engine_utils, monkeypatch):
    monkeypatch.setenv(fork_start.FORK_START_ENV, "0")
    fork_start.install_fork_start()
    assert not is_wrapped(engine_utils.get_mp_context, MARKER)
    assert features.reported()[features.FORK_START] == ("off", f"off by setting ({fork_start.FORK_START_ENV}=0)")


def test_a_gpu_build_spawns(engine_utils, monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    fork_start.install_fork_start()
    assert not is_wrapped(engine_utils.get_mp_context, MARKER)
    assert features.reported()[features.FORK_START] == ("off", "not a CPU build (CUDA needs spawned processes)")


def test_numa_binding_keeps_vllms_spawn(engine_utils, monkeypatch):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the CPU build's test")
    fork_start.install_fork_start()
    monkeypatch.setattr("sys.argv", ["vllm", "serve", "--numa-bind"])
    assert engine_utils.get_mp_context().get_start_method() == "spawn"
