"""in_core_worker: on CPU builds a one-process engine keeps vLLM's "uni" executor (its model
in the engine core) with the OpenMP binding vLLM gives a worker; engines of several ranks,
GPU builds and the setting off keep vLLM's own. On a stand-in platform and vLLM's own
CpuPlatform and OMPProcessManager."""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import pytest

from pdspec.worker.engine import features, in_core_worker
from pdspec.worker.engine.control import IN_CORE_WORKER_ENV
from pdspec.worker.engine.in_core_worker import MARKER, OMP_ENV
from pdspec.worker.engine.wrap_once import is_wrapped


class StandInManager:
    """vLLM's OMPProcessManager's contract: the variables set inside the context only."""

    def __init__(self, vllm_config):
        self.cores = vllm_config.cores

    @contextlib.contextmanager
    def configure_omp_envs(self, rank, local_rank):
        assert (rank, local_rank) == (0, 0)
        saved = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY")}
        os.environ["OMP_NUM_THREADS"] = str(len(self.cores))
        os.environ["GOMP_CPU_AFFINITY"] = " ".join(map(str, self.cores))
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def config(world_size=1, data_parallel_size=1, cores=(1,)):
    parallel = SimpleNamespace(world_size=world_size, data_parallel_size=data_parallel_size)
    return SimpleNamespace(parallel_config=parallel, cores=cores)


def cpu_platform_update(vllm_config):
    """What vLLM's CpuPlatform does to a one-process engine's executor (platforms/cpu.py)."""
    parallel = vllm_config.parallel_config
    parallel.distributed_executor_backend = "uni" if parallel.world_size == 1 else "mp"
    if parallel.distributed_executor_backend == "uni":
        parallel.distributed_executor_backend = "mp"


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    monkeypatch.setattr(features, "_reported", {})
    for name in OMP_ENV:
        monkeypatch.delenv(name, raising=False)


def wrapped_update():
    return in_core_worker._in_core(cpu_platform_update, StandInManager)


def test_a_one_process_engine_runs_in_its_core_with_the_workers_binding():
    vllm_config = config(cores=(1,))
    wrapped_update()(vllm_config)
    assert vllm_config.parallel_config.distributed_executor_backend == "uni"
    # Left set for the engine core this process spawns next (vLLM's context restores them).
    assert os.environ["OMP_NUM_THREADS"] == "1" and os.environ["GOMP_CPU_AFFINITY"] == "1"
    assert features.reported()[features.IN_CORE_WORKER] == ("on", "")


@pytest.mark.parametrize("world_size, data_parallel_size", [(2, 1), (1, 2)])
def test_an_engine_of_several_ranks_keeps_its_worker_processes(world_size, data_parallel_size):
    vllm_config = config(world_size=world_size, data_parallel_size=data_parallel_size, cores=(0, 1))
    wrapped_update()(vllm_config)
    assert vllm_config.parallel_config.distributed_executor_backend == "mp"
    assert "GOMP_CPU_AFFINITY" not in os.environ
    state, reason = features.reported()[features.IN_CORE_WORKER]
    assert state == "off" and "ranks" in reason


def test_another_executor_is_left_alone_and_reported():
    def ray_update(vllm_config):
        vllm_config.parallel_config.distributed_executor_backend = "ray"

    vllm_config = config()
    in_core_worker._in_core(ray_update, StandInManager)(vllm_config)
    assert vllm_config.parallel_config.distributed_executor_backend == "ray"
    assert features.reported()[features.IN_CORE_WORKER] == ("off", "vLLM's ray executor")


def test_the_setting_off_installs_nothing(monkeypatch):
    monkeypatch.setenv(IN_CORE_WORKER_ENV, "0")
    cpu = pytest.importorskip("vllm.platforms.cpu")
    monkeypatch.setattr(cpu.CpuPlatform, "check_and_update_config", cpu.CpuPlatform.__dict__["check_and_update_config"])
    in_core_worker.install_in_core_worker()
    assert not is_wrapped(cpu.CpuPlatform.check_and_update_config, MARKER)
    assert features.reported()[features.IN_CORE_WORKER] == ("off", f"off by setting ({IN_CORE_WORKER_ENV}=0)")


def test_installed_on_vllms_cpu_platform_once(monkeypatch):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("a CPU build's platform")  # the GPU path is the test below
    monkeypatch.delenv(IN_CORE_WORKER_ENV, raising=False)
    platform_cls = type(current_platform)
    original = platform_cls.__dict__["check_and_update_config"]  # restored after the test
    monkeypatch.setattr(platform_cls, "check_and_update_config", original)
    in_core_worker.install_in_core_worker()
    in_core_worker.install_in_core_worker()
    update = platform_cls.check_and_update_config
    assert is_wrapped(update, MARKER)
    # One wrapper, around vLLM's own classmethod.
    assert update.__wrapped__.__func__ is original.__func__ and not is_wrapped(update.__wrapped__, MARKER)


def test_off_on_a_gpu_build(monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self=None: False)
    in_core_worker.install_in_core_worker()
    state, reason = features.reported()[features.IN_CORE_WORKER]
    assert state == "off" and "not a CPU build" in reason


def test_vllms_own_manager_gives_the_binding_of_its_threads_bind(monkeypatch):
    """vLLM's OMPProcessManager on a real (tiny) configuration's bind: OMP_NUM_THREADS and
    the affinity variable of the OpenMP runtime this build preloads."""
    pytest.importorskip("vllm.utils.ompmultiprocessing")
    from vllm.platforms import current_platform
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    if not current_platform.is_cpu():
        pytest.skip("vLLM's OMPProcessManager binds on CPU builds only")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    parallel = SimpleNamespace(local_world_size=1, data_parallel_rank_local=None, _api_process_count=1)
    vllm_config = SimpleNamespace(parallel_config=parallel, kv_transfer_config=None)
    binding = in_core_worker.omp_binding(vllm_config, OMPProcessManager)
    assert binding["OMP_NUM_THREADS"] == "1"
    assert (
        binding.get("GOMP_CPU_AFFINITY") == "1"
        or binding.get("OMP_PLACES") == "{1}"
        or "proclist=[1]" in binding.get("KMP_AFFINITY", "")
    ), binding
    assert "OMP_NUM_THREADS" not in os.environ  # vLLM's context put everything back
