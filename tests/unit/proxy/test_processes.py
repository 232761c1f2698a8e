"""The proxy across cores (`proxy.workers` > 1, proxy/processes.py): real proxy processes
on one port in front of stand-in workers, started as `pdspec proxy` starts them; and the
parent's supervision with planted processes that exit."""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import httpx
import psutil

from pdspec.restarts import RestartPolicy
from pdspec.settings import ProxySettings
from proxy.processes import (
    METRICS_DIR_PREFIX,
    STARTUP_FAILURE,
    STOP_GRACE_S,
    ProxyProcesses,
    fresh_metrics_dir,
    settings_for_process,
)
from proxy.serve import GRACEFUL_SHUTDOWN_S
from tests.harness import REPO, wait_for, wait_healthy
from tests.polling import until
from tests.proxy_cluster import BODY, ProcessCluster, sample
from tests.standin import StandinBehaviour, ThreadServer, create_standin, decode_legs, unused_port

REQUESTS = 'pdspec_proxy_requests_total{endpoint="completions",status="200"}'


def served_by_both(cluster: ProcessCluster, method: str, path: str, **kwargs) -> dict[str, httpx.Response]:
    """Requests on fresh connections until each process has answered one (the kernel picks
    the process of each connection by a hash: 40 all on one process of two is 2^-39)."""
    replies: dict[str, httpx.Response] = {}
    for _ in range(40):
        response, process = cluster.served_by(method, path, **kwargs)
        replies.setdefault(process, response)
        if len(replies) == cluster.workers:
            break
    return replies


def gone(pids: list[int]) -> bool:
    """None of `pids` runs (a zombie left for init to reap does not run)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def test_connections_are_spread_over_the_processes(tmp_path):
    with ProcessCluster(tmp_path / "proxy.log") as c:
        replies = served_by_both(c, "POST", "/v1/completions", json=BODY)
        assert sorted(replies) == ["0", "1"]
        assert all(r.status_code == 200 for r in replies.values())


def test_a_scrape_of_either_process_counts_the_requests_of_both(tmp_path):
    with ProcessCluster(tmp_path / "proxy.log") as c:
        served = [c.served_by("POST", "/v1/completions", json=BODY)[1] for _ in range(12)]
        assert set(served) == {"0", "1"}  # both served some
        scrapes = served_by_both(c, "GET", "/metrics")
        assert sorted(scrapes) == ["0", "1"]
        for scrape in scrapes.values():
            assert sample(scrape.text, REQUESTS) == 12
            # Each process's view of the same workers, not their sum.
            assert sample(scrape.text, 'pdspec_proxy_healthy_workers{pool="prefill"}') == 2
            assert "pid=" not in scrape.text  # every gauge combined over the processes
        for load in served_by_both(c, "GET", "/load").values():
            assert load.json() == {"server_load": 0}


def test_the_requests_in_flight_and_queued_are_summed_over_the_processes(tmp_path):
    with ProcessCluster(tmp_path / "proxy.log", admission={"max_inflight": 2, "max_queue": 20}) as c:
        c.d.delay_s = 4.0  # each process serves one request at a time; the rest wait in its queue
        threads = [
            threading.Thread(target=c.served_by, args=("POST", "/v1/completions"), kwargs={"json": BODY})
            for _ in range(6)
        ]
        for thread in threads:
            thread.start()

        def waiting_or_served() -> float:
            text = httpx.get(c.url + "/metrics", timeout=5).text
            return sample(text, "pdspec_proxy_inflight_requests") + sample(text, "pdspec_proxy_queued_requests")

        # Within the first requests' 4 s; another process's queue is written every second.
        assert wait_for(lambda: waiting_or_served() == 6, timeout_s=3.5, poll_s=0.1)
        c.d.delay_s = 0  # the queued ones go through at once
        for thread in threads:
            thread.join()


def test_ready_and_health_from_either_process(tmp_path):
    with ProcessCluster(tmp_path / "proxy.log") as c:
        for ready in served_by_both(c, "GET", "/ready").values():
            assert ready.status_code == 200 and ready.json()["healthy_workers"] == {"prefill": 2, "decode": 1}
        for health in served_by_both(c, "GET", "/health").values():
            assert health.json() == {"status": "ok"}


def test_a_process_that_dies_is_started_again_and_its_counts_stay(tmp_path):
    with ProcessCluster(tmp_path / "proxy.log") as c:
        assert sorted(served_by_both(c, "POST", "/v1/completions", json=BODY)) == ["0", "1"]  # both counted some
        victim = c.listening()[0]
        survivor = next(p for p in c.processes() if p.pid != victim.pid)
        victim.kill()

        def replaced() -> bool:
            listening = {p.pid for p in c.listening()}
            return len(listening) == 2 and victim.pid not in listening

        assert wait_for(replaced, timeout_s=30), c.log_tail()
        assert survivor.pid in {p.pid for p in c.listening()}  # the other served on
        assert "exited with status -9: starting it again" in c.log_path.read_text()
        assert sorted(served_by_both(c, "POST", "/v1/completions", json=BODY)) == ["0", "1"]
        # Every request counted, the dead process's included.
        assert sample(httpx.get(c.url + "/metrics").text, REQUESTS) == len(decode_legs(c.d))


def test_sigterm_stops_every_process_after_its_requests(tmp_path):
    with ProcessCluster(tmp_path / "proxy.log") as c:
        pids = [p.pid for p in c.processes()]
        metrics_dir = c.processes()[0].environ()["PROMETHEUS_MULTIPROC_DIR"]
        c.d.delay_s = 1.0
        replies = []
        slow = threading.Thread(
            target=lambda: replies.append(httpx.post(c.url + "/v1/completions", json=BODY, timeout=20))
        )
        slow.start()
        assert wait_for(lambda: len(c.d.received) == 1, timeout_s=10)  # its decode leg is under way
        os.kill(c.proxy.process.pid, signal.SIGTERM)  # the parent alone
        assert c.proxy.process.wait(timeout=30) == 0
        slow.join()
        assert replies[0].status_code == 200  # finished before its process stopped
        assert gone(pids)
        assert not os.path.exists(metrics_dir)


def test_a_killed_parent_leaves_no_process_serving(tmp_path):
    with ProcessCluster(tmp_path / "proxy.log") as c:
        pids = [p.pid for p in c.processes()]
        metrics_dir = c.processes()[0].environ()["PROMETHEUS_MULTIPROC_DIR"]
        os.kill(c.proxy.process.pid, signal.SIGKILL)
        c.proxy.process.wait(timeout=10)
        assert wait_for(lambda: gone(pids), timeout_s=20)
    shutil.rmtree(metrics_dir)  # left by the killed parent (the next proxy's start removes such folders)


def test_a_new_parent_removes_the_metrics_folders_of_parents_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    stale = tmp_path / f"{METRICS_DIR_PREFIX}{ended.pid}-abc"
    running = tmp_path / f"{METRICS_DIR_PREFIX}{os.getpid()}-def"  # a parent still running: kept
    other = tmp_path / "something-else"
    for folder in (stale, running, other):
        folder.mkdir()
        (folder / "counter_1.db").write_bytes(b"")
    fresh = fresh_metrics_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, running.name, other.name])
    assert fresh.name.startswith(f"{METRICS_DIR_PREFIX}{os.getpid()}-") and not any(fresh.iterdir())


def test_a_second_proxy_on_the_port_is_refused_not_let_in(tmp_path):
    """SO_REUSEPORT would let it take part of the first one's connections."""
    with ProcessCluster(tmp_path / "proxy.log") as c:
        env = {**os.environ, "PDSPEC_PROXY": json.dumps({"port": c.port, "workers": 2})}
        second = subprocess.run(
            [sys.executable, "-m", "pdspec.cli", "proxy"], env=env, cwd=REPO, capture_output=True, timeout=60
        )
        assert second.returncode == STARTUP_FAILURE
        assert b"cannot listen on" in second.stderr
        assert c.served_by("POST", "/v1/completions", json=BODY)[0].status_code == 200


def test_the_admission_limits_hold_for_the_proxy_as_a_whole(tmp_path):
    """max_inflight 2 over two processes: one each; without the division each would take 2."""
    with ProcessCluster(tmp_path / "proxy.log", admission={"max_inflight": 2, "max_queue": 0}) as c:
        c.d.delay_s = 1.5
        statuses: list[int] = []

        def send() -> None:
            statuses.append(c.served_by("POST", "/v1/completions", json=BODY)[0].status_code)

        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(set(statuses)) == [200, 429]
        assert statuses.count(200) <= 2


def test_python_m_proxy_reads_workers_from_a_config_file(tmp_path):
    """As a benchmark would start it: `python -m proxy`, the settings in a TOML file."""
    behaviours = [StandinBehaviour(), StandinBehaviour()]
    with ThreadServer(create_standin(behaviours[0])) as prefill, ThreadServer(create_standin(behaviours[1])) as decode:
        port = unused_port()
        config = tmp_path / "proxy.toml"
        config.write_text(
            f'[proxy]\nport = {port}\nworkers = 2\nprefill_urls = ["{prefill.url}"]\ndecode_urls = ["{decode.url}"]\n'
        )
        log_path = tmp_path / "proxy.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "proxy"],
                env={**os.environ, "PDSPEC_CONFIG": str(config)},
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_healthy(f"http://127.0.0.1:{port}", process, log_path, path="/ready")
            assert wait_for(lambda: len(psutil.Process(process.pid).children()) == 2)
            reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY, timeout=20)
            assert reply.status_code == 200
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            # The log says why, should a process exit non-zero (once in a fresh-clone CI run).
            assert process.wait(timeout=30) == 0, log_path.read_text()[-4000:]


def test_each_process_gets_its_share_of_the_limits_and_the_shares_sum_to_them():
    settings = ProxySettings(
        workers=3, admission={"max_inflight": 256, "max_queue": 10}, clients={"max_connections": 4096}
    )
    shares = [settings_for_process(settings, i) for i in range(3)]
    assert [s.admission.max_inflight for s in shares] == [86, 85, 85]
    assert [s.admission.max_queue for s in shares] == [4, 3, 3]
    assert [s.clients.max_connections for s in shares] == [1366, 1365, 1365]
    for share in shares:
        assert share.workers == 1  # one process: it never starts processes of its own
        assert ProxySettings.model_validate(share.model_dump()) == share
        assert share.admission.queue_timeout_s == settings.admission.queue_timeout_s  # the rest as set


def test_stopping_waits_for_the_graceful_shutdown():
    assert STOP_GRACE_S > GRACEFUL_SHUTDOWN_S


class Planted(ProxyProcesses):
    """The parent, with two processes that run `script` instead of the proxy."""

    def __init__(self, metrics_dir, script: str, restarts: RestartPolicy | None = None) -> None:
        super().__init__(ProxySettings(workers=2), metrics_dir, restarts)
        self.command = (sys.executable, "-c", script)


# A planted process that says it listens, as proxy/processes.py's `main` does, then exits.
LISTENS_THEN_EXITS = (
    "import json, os; slot = json.loads(os.environ['PDSPEC_PROXY_PROCESS']); "
    "os.write(slot['listening_fd'], b'L'); raise SystemExit(1)"
)


async def test_a_process_that_exits_before_it_listens_stops_the_proxy(tmp_path):
    parent = Planted(tmp_path, "raise SystemExit(2)")
    assert await asyncio.wait_for(parent.run(), 30) == 1
    assert [slot.process.returncode for slot in parent.slots] == [2, 2]


async def test_a_stop_while_the_processes_start_is_a_stop_not_a_failure(tmp_path):
    """SIGTERM to the process group while a process is still starting (it did in a fresh-clone
    CI run of test_python_m_proxy_reads_workers_from_a_config_file): the process dies before it
    listens, and the proxy exits 0, as any stop."""
    parent = Planted(tmp_path, "import time; time.sleep(60)")  # never listens
    run = asyncio.create_task(parent.run())
    await until(lambda: all(slot.process is not None for slot in parent.slots))
    os.kill(os.getpid(), signal.SIGTERM)  # caught by the parent's handler on this loop
    await until(lambda: parent.stopping.is_set())
    for slot in parent.slots:  # as the group's signal reaches them
        os.kill(slot.process.pid, signal.SIGTERM)
    assert await asyncio.wait_for(run, 30) == 0
    assert [slot.process.returncode for slot in parent.slots] == [-signal.SIGTERM, -signal.SIGTERM]


async def test_a_process_that_keeps_exiting_stops_the_proxy(tmp_path):
    restarts = RestartPolicy(max_restarts=2, window_s=60, backoff_s=0.01)
    parent = Planted(tmp_path, LISTENS_THEN_EXITS, restarts)
    assert await asyncio.wait_for(parent.run(), 30) == 1
    # A slot's first start and two restarts, then the exit that stopped the proxy (the
    # other slot may have been stopped before its own third exit).
    assert max(restarts.exits_in_window(f"process {i}") for i in range(2)) == 3
