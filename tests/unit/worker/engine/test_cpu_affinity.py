"""CPU builds: NixlConnector's KV core stays among the worker's own cores, and the main thread
gets its cores back (pdspec/worker/engine/cpu_affinity.py)."""

import os

import pytest

from pdspec.worker.engine import control, cpu_affinity
from pdspec.worker.engine.cpu_affinity import KV_CORE_MARKER
from pdspec.worker.engine.wrap_once import is_wrapped


def test_kv_core_is_chosen_among_the_allowed_cores():
    nodes = [[0, 1], [2, 3]]
    assert cpu_affinity.cores_within(nodes, {0}) == [[0]]
    assert cpu_affinity.cores_within(nodes, {1, 2}) == [[1], [2]]
    assert cpu_affinity.cores_within(nodes, {0, 1, 2, 3}) == nodes  # unbound: vLLM's answer
    assert cpu_affinity.cores_within(nodes, {7}) == nodes  # nothing allowed: keep vLLM's


def test_real_cpu_platform_picks_the_workers_own_core(monkeypatch):
    """On vLLM's own CpuPlatform: a worker bound to core 0 gets core 0 as its KV core,
    where unpatched vLLM picks the node's last core (the decode worker's core here)."""
    pytest.importorskip("vllm")
    from vllm.platforms.cpu import CpuPlatform

    nodes = CpuPlatform.discover_numa_topology()
    all_cores = sorted(core for node in nodes for core in node)
    if len(all_cores) < 2:
        pytest.skip("needs a machine with at least two cores")  # CI and this machine have 2
    first = all_cores[0]
    assert [max(node) for node in nodes] != [first]  # the bug: vLLM's choice ignores the binding
    monkeypatch.setattr(CpuPlatform, "discover_numa_topology", CpuPlatform.discover_numa_topology)
    assert cpu_affinity.install_kv_core_within_own_cpus(CpuPlatform)
    assert not cpu_affinity.install_kv_core_within_own_cpus(CpuPlatform)  # idempotent
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {first})
    assert [max(node) for node in CpuPlatform.discover_numa_topology()] == [first]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(all_cores))
    assert CpuPlatform.discover_numa_topology() == nodes


@pytest.fixture
def affinity_classes(monkeypatch):
    """vLLM's CPU platform and NIXL worker classes, restored after the test patches them."""
    pytest.importorskip("vllm")
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
    from vllm.platforms.cpu import CpuPlatform

    monkeypatch.setattr(CpuPlatform, "discover_numa_topology", CpuPlatform.discover_numa_topology)
    monkeypatch.setattr(NixlBaseConnectorWorker, "__init__", NixlBaseConnectorWorker.__init__)
    return CpuPlatform, NixlBaseConnectorWorker


def test_affinity_fix_is_installed_only_for_pd_workers(monkeypatch, affinity_classes):
    CpuPlatform, _ = affinity_classes  # noqa: N806
    monkeypatch.setenv(control.ROLE_ENV, "colocated")
    cpu_affinity.install_cpu_affinity_fix()
    assert not is_wrapped(CpuPlatform.discover_numa_topology, KV_CORE_MARKER)
    monkeypatch.setenv(control.ROLE_ENV, "prefill")
    cpu_affinity.install_cpu_affinity_fix()
    assert is_wrapped(CpuPlatform.discover_numa_topology, KV_CORE_MARKER)


def test_main_thread_gets_its_cores_back_after_the_connector_pins_it(monkeypatch):
    affinity = {"now": {0, 1, 2, 3}}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(affinity["now"]))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: affinity.update(now=set(cores)))
    seen_inside = []

    class FakeNixlWorker:
        def __init__(self, kv_cores):
            os.sched_setaffinity(0, kv_cores)  # what vLLM's NixlConnector worker does
            seen_inside.append(os.sched_getaffinity(0))  # NIXL's threads start here

    assert cpu_affinity.install_affinity_restore(FakeNixlWorker)
    assert not cpu_affinity.install_affinity_restore(FakeNixlWorker)
    FakeNixlWorker([3])
    assert seen_inside == [{3}]  # NIXL's threads still get the KV core
    assert affinity["now"] == {0, 1, 2, 3}  # the main thread its own cores back


def test_affinity_restore_wraps_vllms_nixl_worker(monkeypatch, affinity_classes):
    _, NixlBaseConnectorWorker = affinity_classes  # noqa: N806
    monkeypatch.setenv(control.ROLE_ENV, "decode")
    cpu_affinity.install_cpu_affinity_fix()
    assert is_wrapped(NixlBaseConnectorWorker.__init__, "cpu_affinity_restore")
