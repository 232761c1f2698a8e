"""`pdspec up` plans its children: one worker per role by default, an xPyD fleet with
replicas (ports apart, cores and GPUs split, a run dir and a log each), and a proxy that
knows every worker."""

import json
import subprocess
import sys

import pytest

from pdspec.settings import PrefillWorkerSettings, UpCommand
from pdspec.supervisor import plan_children, proxy_settings_for, replica_run_dir, replica_settings, start_waves


def test_one_worker_per_role_by_default(tmp_path):
    children = plan_children(UpCommand(run_dir=tmp_path))
    assert [c.name for c in children] == ["prefill worker", "decode worker", "proxy"]
    assert [c.log_path.name for c in children] == ["prefill.log", "decode.log", "proxy.log"]


def test_xpyd_fleet(tmp_path):
    up = UpCommand(run_dir=tmp_path, prefill={"replicas": 2, "cpu_omp_threads_bind": "0-3"}, decode={"replicas": 3})
    children = plan_children(up)
    assert [c.name for c in children] == [
        "prefill-0 worker",
        "prefill-1 worker",
        "decode-0 worker",
        "decode-1 worker",
        "decode-2 worker",
        "proxy",
    ]
    assert [c.health_url for c in children[:5]] == [
        "http://127.0.0.1:8100/health",
        "http://127.0.0.1:8101/health",
        "http://127.0.0.1:8200/health",
        "http://127.0.0.1:8201/health",
        "http://127.0.0.1:8202/health",
    ]
    assert len({c.log_path for c in children}) == len(children)
    proxy = proxy_settings_for(up)
    assert proxy.prefill_urls == ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    assert len(proxy.decode_urls) == 3
    assert proxy.kv_transfer.source_ports[-1] == "5600-5604"  # both prefill side channels may be named
    # Each replica's engine has its own control files and metrics folder.
    assert replica_run_dir(tmp_path, "prefill", 0) == tmp_path
    assert (tmp_path / "replicas" / "prefill-1" / "prefill" / "prometheus").is_dir()


@pytest.mark.parametrize(
    "cores, gpus, expected",
    [
        ("0-3", "0,1,2,3", [("0-1", "0,1"), ("2-3", "2,3")]),
        ("0,2", None, [("0", None), ("2", None)]),
        ("0,2,4,6", None, [("0,2", None), ("4,6", None)]),  # not a range: core 1 is the decode worker's
        ("0", None, [("0", None), ("0", None)]),  # fewer cores than replicas: shared
        ("0-3|4-7", None, [("0-3|4-7", None)] * 2),  # vLLM's per-rank form: left alone
    ],
)
def test_replicas_split_cores_and_gpus(cores, gpus, expected):
    base = PrefillWorkerSettings(replicas=2, cpu_omp_threads_bind=cores, cuda_visible_devices=gpus)
    replicas = replica_settings(base)
    assert [(w.cpu_omp_threads_bind, w.cuda_visible_devices) for w in replicas] == expected
    ports = {
        (w.port, w.side_channel_port, w.kv_events_port, w.kv_events_port + w.kv_events_replay_offset) for w in replicas
    }
    assert ports == {(8100, 5600, 5650, 5651), (8101, 5604, 5652, 5653)}
    assert all(w.replicas == 1 for w in replicas)


def gpu_children(tmp_path, up: UpCommand, monkeypatch):
    """The children `pdspec up` plans on a GPU build."""
    import pdspec.worker.launch as launch

    monkeypatch.setattr(launch, "is_cpu_build", lambda: False)
    return plan_children(up)


def names(waves) -> list[list[str]]:
    return [[c.name for c in wave] for wave in waves]


def test_workers_sharing_a_gpu_start_in_turn(tmp_path, monkeypatch):
    """The one-GPU 1P1D profile: both engines on GPU 0, which fail when they measure its
    free memory at once; the decode worker starts once the prefill worker is ready."""
    waves = start_waves(gpu_children(tmp_path, UpCommand(run_dir=tmp_path), monkeypatch))
    assert names(waves) == [["prefill worker"], ["decode worker", "proxy"]]


def test_workers_with_a_given_kv_size_share_a_gpu_and_start_together(tmp_path, monkeypatch):
    """A 2P2D fleet on one GPU whose engines are told their KV size (vLLM 0.33's
    --kv-cache-memory-bytes: no memory profile) starts in one wave; a worker that measures
    the GPU's free memory still starts alone, after those before it."""
    sized = {"replicas": 2, "extra_vllm_args": ["--kv-cache-memory-bytes", "5000000000"]}
    fleet = UpCommand(run_dir=tmp_path, prefill=sized, decode=sized)
    assert names(start_waves(gpu_children(tmp_path, fleet, monkeypatch))) == [
        ["prefill-0 worker", "prefill-1 worker", "decode-0 worker", "decode-1 worker", "proxy"]
    ]
    mixed = UpCommand(run_dir=tmp_path, prefill=sized, decode={"replicas": 2})
    assert names(start_waves(gpu_children(tmp_path, mixed, monkeypatch))) == [
        ["prefill-0 worker", "prefill-1 worker"],
        ["decode-0 worker"],
        ["decode-1 worker", "proxy"],
    ]
    flag_form = UpCommand(
        run_dir=tmp_path,
        prefill={"extra_vllm_args": ["--kv-cache-memory-bytes=5000000000"]},
        decode={"extra_vllm_args": ["--kv-cache-memory-bytes=5000000000"]},
    )
    assert names(start_waves(gpu_children(tmp_path, flag_form, monkeypatch))) == [
        ["prefill worker", "decode worker", "proxy"]
    ]


def test_workers_on_their_own_gpus_start_together(tmp_path, monkeypatch):
    up = UpCommand(
        run_dir=tmp_path,
        prefill={"replicas": 2, "cuda_visible_devices": "0,1"},
        decode={"replicas": 2, "cuda_visible_devices": "2,3"},
    )
    assert names(start_waves(gpu_children(tmp_path, up, monkeypatch))) == [
        ["prefill-0 worker", "prefill-1 worker", "decode-0 worker", "decode-1 worker", "proxy"]
    ]
    shared = UpCommand(run_dir=tmp_path, prefill={"cuda_visible_devices": "0,1"}, decode={"cuda_visible_devices": "1"})
    assert names(start_waves(gpu_children(tmp_path, shared, monkeypatch))) == [
        ["prefill worker"],
        ["decode worker", "proxy"],
    ]  # GPU 1 is in both


def test_workers_sharing_a_gpu_and_pulling_are_warned(tmp_path, monkeypatch):
    import pdspec.worker.launch as launch
    from pdspec.supervisor import kv_transfer_advice

    shared = UpCommand(run_dir=tmp_path)  # both on GPU 0
    monkeypatch.setattr(launch, "is_cpu_build", lambda: True)
    assert kv_transfer_advice(plan_children(shared), shared) is None  # a CPU build: no GPUs
    advice = kv_transfer_advice(gpu_children(tmp_path, shared, monkeypatch), shared)
    assert advice is not None and "share GPU 0" in advice and "push" in advice
    pushing = UpCommand(run_dir=tmp_path, model={"kv_transfer": "push"})
    assert kv_transfer_advice(gpu_children(tmp_path, pushing, monkeypatch), pushing) is None
    apart = UpCommand(run_dir=tmp_path, prefill={"cuda_visible_devices": "0"}, decode={"cuda_visible_devices": "1"})
    assert kv_transfer_advice(gpu_children(tmp_path, apart, monkeypatch), apart) is None


def test_on_the_cpu_build_everything_starts_at_once(tmp_path):
    # This machine's build: cores are split, not measured, so nothing waits.
    assert names(start_waves(plan_children(UpCommand(run_dir=tmp_path)))) == [
        ["prefill worker", "decode worker", "proxy"]
    ]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_child(tmp_path, name: str, code: str):
    from pdspec.supervisor import Child

    return Child(name, [sys.executable, "-c", code], {}, "http://127.0.0.1:9/health", tmp_path / f"{name}.log")


def drive(children, policy, ticks: int):
    """Run the supervision loop for `ticks` ticks of 1 s (waiting for children to exit for real)."""
    from pdspec.supervisor import supervise

    clock, said, restarted = Clock(), [], []

    def sleep(_):
        for child in children:
            if child.process is not None and child.process.poll() is None:
                try:
                    child.process.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
        clock.now += 1
        if clock.now > ticks:
            raise StopIteration

    try:
        supervise(children, policy, said.append, restarted.append, clock=clock, sleep=sleep)
    except StopIteration:
        pass
    return said, restarted


def test_a_child_that_exits_is_restarted_and_its_log_kept(tmp_path):
    from pdspec.restarts import RestartPolicy

    crash = fake_child(tmp_path, "decode worker", "print('run'); raise SystemExit(3)")
    steady = fake_child(tmp_path, "proxy", "import time; time.sleep(60)")
    for child in (crash, steady):
        child.start()
    try:
        said, restarted = drive([crash, steady], RestartPolicy(max_restarts=10, window_s=1000, backoff_s=1), ticks=6)
    finally:
        for child in (crash, steady):
            child.stop(1)
    assert restarted and set(restarted) == {"decode worker"}
    assert any("exited with code 3; restarting it in 1s" in line for line in said)
    assert crash.log_path.read_text().count("run") == 1 + len(restarted)  # appended, not truncated


def test_every_start_of_a_worker_gets_a_fresh_prometheus_folder(tmp_path):
    """A restarted worker must not inherit the dead process's metrics files (vLLM wants the
    folder empty; left there, its gauges and counters stay on /metrics)."""
    from pathlib import Path

    from pdspec.restarts import RestartPolicy

    children = plan_children(UpCommand(run_dir=tmp_path))
    decode = next(c for c in children if c.name == "decode worker")
    folder = Path(decode.env["PROMETHEUS_MULTIPROC_DIR"])
    decode.argv = [sys.executable, "-c", "print('run'); raise SystemExit(3)"]  # dies at once
    decode.start()
    (folder / "counter_12345.db").write_bytes(b"the dead process's counters")
    try:
        said, restarted = drive([decode], RestartPolicy(max_restarts=10, window_s=1000, backoff_s=1), ticks=4)
    finally:
        decode.stop(1)
    assert restarted == ["decode worker"] * len(restarted) and restarted
    assert folder.is_dir() and not (folder / "counter_12345.db").exists()
    assert all(c.before_start is not None for c in children if c.name.endswith("worker"))


def test_too_many_exits_or_fail_fast_stop_the_stack_naming_the_child(tmp_path):
    from pdspec.restarts import RestartPolicy
    from pdspec.supervisor import StartupError

    for policy, expected in (
        (RestartPolicy(max_restarts=1, window_s=1000, backoff_s=1), "2 times in 1000s"),
        (RestartPolicy(enabled=False), "exited with code 4:"),
    ):
        child = fake_child(tmp_path, "prefill worker", "print('boom'); raise SystemExit(4)")
        child.start()
        try:
            with pytest.raises(StartupError, match=expected) as error:
                drive([child], policy, ticks=20)
        finally:
            child.stop(1)
        assert "prefill worker" in str(error.value) and "boom" in str(error.value)


def test_port_clashes_are_refused_before_anything_starts():
    from pdspec.supervisor import StartupError, check_ports

    check_ports(UpCommand(prefill={"replicas": 8}, decode={"replicas": 8}))
    with pytest.raises(StartupError, match="port 5650 is both prefill-0's KV events and prefill-12's NIXL"):
        check_ports(UpCommand(prefill={"replicas": 14}))
    with pytest.raises(StartupError, match="8100"):
        check_ports(UpCommand(proxy={"port": 8100}))
    # A wider replay offset spreads the replicas' KV-event ports as far.
    replicas = replica_settings(PrefillWorkerSettings(replicas=2, kv_events_replay_offset=4))
    assert [w.kv_events_port for w in replicas] == [5650, 5655]


def test_the_proxy_gets_its_workers_setting(tmp_path):
    """`pdspec up --proxy.workers 2`: the proxy it starts runs two processes on its port."""
    proxy = plan_children(UpCommand(run_dir=tmp_path, proxy={"workers": 2}))[-1]
    assert proxy.name == "proxy"
    assert json.loads(proxy.env["PDSPEC_PROXY"])["workers"] == 2


def test_the_proxy_tokenizes_with_the_served_models_tokenizer(tmp_path):
    # The local model: its installed folder (run_up installs it before the children start).
    models = tmp_path / "models"
    (models / "target").mkdir(parents=True)
    assert proxy_settings_for(UpCommand(model={"models_dir": models})).routing.tokenizer is None  # not installed
    (models / "target" / "tokenizer.json").write_text("{}")
    assert proxy_settings_for(UpCommand(model={"models_dir": models})).routing.tokenizer == models / "target"
    # A target of its own: its folder when local; a Hugging Face name is the workers' to fetch.
    assert (
        proxy_settings_for(UpCommand(model={"target": str(models / "target")})).routing.tokenizer == models / "target"
    )
    assert proxy_settings_for(UpCommand(model={"target": "Qwen/Qwen3-8B"})).routing.tokenizer is None
    # One set by hand is kept.
    own = UpCommand(model={"models_dir": models}, proxy={"routing": {"tokenizer": str(tmp_path / "mine")}})
    assert proxy_settings_for(own).routing.tokenizer == tmp_path / "mine"
