"""in_core_worker: on CPU builds a one-process engine keeps vLLM's "uni" executor (its model
in the engine core), its engine core started with the OpenMP binding vLLM gives a worker;
engines of several ranks, an explicit "mp", vLLM without multiprocessing, GPU builds and
the setting off keep vLLM's own. On stand-ins of vLLM's platform and managers, and on
vLLM's own CpuPlatform, OMPProcessManager and CoreEngineProcManager."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from types import SimpleNamespace

import pytest

from pdspec.worker.engine import features, in_core_worker
from pdspec.worker.engine.control import IN_CORE_WORKER_ENV, MODEL_IN_CORE_ENV, ROLE_ENV
from pdspec.worker.engine.in_core_worker import MARKER, NO_QUEUE
from pdspec.worker.engine.wrap_once import is_wrapped

OMP_NAMES = ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY")


class StandInOmpManager:
    """vLLM's OMPProcessManager's contract: the variables set inside the context only."""

    def __init__(self, vllm_config):
        self.cores = vllm_config.cores

    @contextlib.contextmanager
    def configure_omp_envs(self, rank, local_rank):
        assert (rank, local_rank) == (0, 0)
        if not self.cores:  # nobind
            yield
            return
        with in_core_worker.environment(
            {"OMP_NUM_THREADS": str(len(self.cores)), "GOMP_CPU_AFFINITY": " ".join(map(str, self.cores))}
        ):
            yield


def config(world_size=1, data_parallel_size=1, cores=(1,), asked="uni"):
    parallel = SimpleNamespace(
        world_size=world_size, data_parallel_size=data_parallel_size, distributed_executor_backend=asked
    )
    return SimpleNamespace(parallel_config=parallel, cores=cores)


def cpu_platform_update(vllm_config):
    """What vLLM's CpuPlatform does to the executor (platforms/cpu.py, multiprocessing on)."""
    parallel = vllm_config.parallel_config
    if parallel.distributed_executor_backend == "uni":
        parallel.distributed_executor_backend = "mp"


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """No feature state, binding or OpenMP variable left from another test, none left after."""
    monkeypatch.setattr(features, "_reported", {})
    monkeypatch.setattr(in_core_worker, "_binding", None)
    for name in (*OMP_NAMES, MODEL_IN_CORE_ENV, IN_CORE_WORKER_ENV):
        monkeypatch.setenv(name, "")  # recorded, so the delete below is undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv(ROLE_ENV, "prefill")


def update(vllm_config, platform_update=cpu_platform_update):
    in_core_worker._in_core(platform_update, StandInOmpManager)(vllm_config)


def test_a_one_process_engine_runs_in_its_core_started_with_the_workers_binding():
    vllm_config = config(cores=(1,))
    update(vllm_config)
    assert vllm_config.parallel_config.distributed_executor_backend == "uni"
    assert in_core_worker._binding == {"OMP_NUM_THREADS": "1", "GOMP_CPU_AFFINITY": "1", MODEL_IN_CORE_ENV: "1"}
    assert "GOMP_CPU_AFFINITY" not in os.environ  # this process keeps its own environment
    assert features.reported()[features.IN_CORE_WORKER] == ("on", "")
    assert features.reported()[features.SHORT_SPIN] == ("off", NO_QUEUE)


def test_the_binding_is_set_around_the_engine_cores_start_only():
    seen = {}

    class StandInProcManager:
        def __init__(self, *args, **kwargs):
            seen.update({name: os.environ.get(name) for name in (*OMP_NAMES, MODEL_IN_CORE_ENV)})

    start = in_core_worker._bound_start(StandInProcManager.__init__)
    update(config(cores=(0,)))
    start(StandInProcManager())
    assert seen == {"OMP_NUM_THREADS": "1", "GOMP_CPU_AFFINITY": "0", MODEL_IN_CORE_ENV: "1"}
    assert not any(name in os.environ for name in seen)  # restored after the start
    # Used once: a later engine core (another configuration, not switched) starts unbound.
    start(StandInProcManager())
    assert seen == dict.fromkeys(seen)


def test_an_engine_core_sets_the_backend_of_its_copies_without_binding_or_reporting(monkeypatch):
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # a spawned process
    vllm_config = config()
    update(vllm_config)
    assert vllm_config.parallel_config.distributed_executor_backend == "uni"
    assert in_core_worker._binding is None and features.reported() == {}


@pytest.mark.parametrize(
    "world_size, data_parallel_size, reason",
    [(2, 1, "an engine of 2 ranks (tensor or pipeline parallel)"), (1, 2, "data parallel")],
)
def test_an_engine_of_several_ranks_keeps_its_worker_processes(world_size, data_parallel_size, reason):
    vllm_config = config(world_size=world_size, data_parallel_size=data_parallel_size, cores=(0, 1))
    update(vllm_config)
    assert vllm_config.parallel_config.distributed_executor_backend == "mp"
    assert in_core_worker._binding is None
    assert features.reported() == {features.IN_CORE_WORKER: ("off", reason)}


def test_an_explicit_mp_executor_is_kept():
    vllm_config = config(asked="mp")
    update(vllm_config)
    assert vllm_config.parallel_config.distributed_executor_backend == "mp"
    assert features.reported()[features.IN_CORE_WORKER] == ("off", "vLLM's mp executor asked for")


def test_without_vllms_multiprocessing_the_model_runs_in_the_front_end_and_says_so():
    vllm_config = config()
    update(vllm_config, platform_update=lambda vllm_config: None)  # VLLM_ENABLE_V1_MULTIPROCESSING=0
    assert vllm_config.parallel_config.distributed_executor_backend == "uni"
    state, reason = features.reported()[features.IN_CORE_WORKER]
    assert state == "off" and "VLLM_ENABLE_V1_MULTIPROCESSING=0" in reason


def test_without_a_binding_the_engine_core_starts_unbound_all_the_same():
    update(config(cores=()))  # VLLM_CPU_OMP_THREADS_BIND=nobind
    assert in_core_worker._binding == {MODEL_IN_CORE_ENV: "1"}


def test_the_setting_off_installs_nothing(monkeypatch):
    cpu = pytest.importorskip("vllm.platforms.cpu")
    monkeypatch.setenv(IN_CORE_WORKER_ENV, "0")
    monkeypatch.setattr(cpu.CpuPlatform, "check_and_update_config", cpu.CpuPlatform.__dict__["check_and_update_config"])
    in_core_worker.install_in_core_worker()
    assert not is_wrapped(cpu.CpuPlatform.check_and_update_config, MARKER)
    assert features.reported()[features.IN_CORE_WORKER] == ("off", f"off by setting ({IN_CORE_WORKER_ENV}=0)")


def vllms_own(function):
    """The function under pdspec's wrappers (another test may have installed some)."""
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return getattr(function, "__func__", function)


def test_installed_on_vllms_cpu_platform_and_engine_start_once(monkeypatch):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("a CPU build's platform")  # GPU builds: test_off_on_a_gpu_build
    engine_utils = pytest.importorskip("vllm.v1.engine.utils")
    platform_cls, manager_cls = type(current_platform), engine_utils.CoreEngineProcManager
    # Restored after the test: vLLM's own functions, whatever was installed before.
    monkeypatch.setattr(
        platform_cls, "check_and_update_config", classmethod(vllms_own(platform_cls.check_and_update_config))
    )
    monkeypatch.setattr(manager_cls, "__init__", vllms_own(manager_cls.__init__))
    in_core_worker.install_in_core_worker()
    in_core_worker.install_in_core_worker()
    for wrapped in (platform_cls.check_and_update_config, manager_cls.__init__):
        assert is_wrapped(wrapped, MARKER) and not is_wrapped(wrapped.__wrapped__, MARKER)  # one wrapper


def test_off_on_a_gpu_build(monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self=None: False)
    in_core_worker.install_in_core_worker()
    state, reason = features.reported()[features.IN_CORE_WORKER]
    assert state == "off" and "not a CPU build" in reason


def test_vllms_own_manager_gives_the_binding_of_its_threads_bind(monkeypatch):
    """vLLM's OMPProcessManager on a configuration bound to core 1: OMP_NUM_THREADS and the
    affinity variable of the OpenMP runtime this process preloads (none here: OMP_PLACES)."""
    from vllm.platforms import current_platform
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    if not current_platform.is_cpu():
        pytest.skip("vLLM's OMPProcessManager binds on CPU builds only")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    parallel = SimpleNamespace(local_world_size=1, data_parallel_rank_local=None, _api_process_count=1)
    vllm_config = SimpleNamespace(parallel_config=parallel, kv_transfer_config=None)
    binding = in_core_worker.omp_binding(vllm_config, OMPProcessManager)
    assert binding["OMP_NUM_THREADS"] == "1"
    bound = (
        binding.get("GOMP_CPU_AFFINITY") == "1"
        or binding.get("OMP_PLACES") == "{1}"
        or "proclist=[1]" in binding.get("KMP_AFFINITY", "")
    )
    assert bound, binding
    assert "OMP_NUM_THREADS" not in os.environ  # vLLM's context put everything back
