"""`pdspec up` plans its children: one worker per role by default, an xPyD fleet with
replicas (ports apart, cores and GPUs split, a run dir and a log each), and a proxy that
knows every worker."""

import pytest

from pdspec.settings import PrefillWorkerSettings, UpCommand
from pdspec.supervisor import plan_children, proxy_settings_for, replica_run_dir, replica_settings




def test_one_worker_per_role_by_default(tmp_path):
    children = plan_children(UpCommand(run_dir=tmp_path))
    assert [c.name for c in children] == ["prefill worker", "decode worker", "proxy"]
    assert [c.log_path.name for c in children] == ["prefill.log", "decode.log", "proxy.log"]


def test_xpyd_fleet(tmp_path):
    up = UpCommand(run_dir=tmp_path, prefill={"replicas": 2, "cpu_omp_threads_bind": "0-3"}, decode={"replicas": 3})
    children = plan_children(up)
    assert [c.name for c in children] == ["prefill-0 worker", "prefill-1 worker", "decode-0 worker",
                                          "decode-1 worker", "decode-2 worker", "proxy"]  # fmt: skip
    assert [c.health_url for c in children[:5]] == [
        "http://127.0.0.1:8100/health", "http://127.0.0.1:8101/health",
        "http://127.0.0.1:8200/health", "http://127.0.0.1:8201/health", "http://127.0.0.1:8202/health",
    ]  # fmt: skip
    assert len({c.log_path for c in children}) == len(children)
    proxy = proxy_settings_for(up)
    assert proxy.prefill_urls == ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    assert len(proxy.decode_urls) == 3
    assert proxy.kv_source_ports[-1] == "5600-5604"  # both prefill side channels may be named
    # Each replica's engine has its own control files and metrics folder.
    assert replica_run_dir(tmp_path, "prefill", 0) == tmp_path
    assert (tmp_path / "replicas" / "prefill-1" / "prefill" / "prometheus").is_dir()


@pytest.mark.parametrize("cores, gpus, expected", [
    ("0-3", "0,1,2,3", [("0-1", "0,1"), ("2-3", "2,3")]),
    ("0,2", None, [("0", None), ("2", None)]),
    ("0", None, [("0", None), ("0", None)]),  # fewer cores than replicas: shared
    ("0-3|4-7", None, [("0-3|4-7", None)] * 2),  # vLLM's per-rank form: left alone
])  # fmt: skip
def test_replicas_split_cores_and_gpus(cores, gpus, expected):
    base = PrefillWorkerSettings(replicas=2, cpu_omp_threads_bind=cores, cuda_visible_devices=gpus)
    replicas = replica_settings(base)
    assert [(w.cpu_omp_threads_bind, w.cuda_visible_devices) for w in replicas] == expected
    ports = {(w.port, w.side_channel_port, w.kv_events_port, w.kv_events_port + w.kv_events_replay_offset)
             for w in replicas}  # fmt: skip
    assert ports == {(8100, 5600, 5650, 5651), (8101, 5604, 5652, 5653)}
    assert all(w.replicas == 1 for w in replicas)
