"""A real proxy in front of stand-in workers (two prefill, one decode), for the proxy's
unit tests of failures, clients leaving and metrics."""

from pathlib import Path

import httpx
import psutil

from pdspec.settings import ProxySettings
from proxy.serve import PROCESS_HEADER
from tests.harness import merged, start_proxy, wait_for, wait_healthy
from tests.standin import StandinBehaviour, ThreadServer, create_standin, proxy_server, unused_port

BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}
# The pdspec_worker_info labels of stand-ins that pair with each other: EAGLE3 K=3, blocks
# of 4 tokens (so short prompts make whole blocks for cache-aware routing).
PAIRED_INFO = {
    "role": "x",
    "model": "/m/t",
    "drafter": "/m/eagle3",
    "method": "eagle3",
    "num_speculative_tokens": "3",
    "block_size": "4",
    "vllm_version": "0.32.0",
    "drafts_policy": "auto",
}


class Cluster:
    """Two prefill stand-ins and one decode stand-in behind a real proxy."""

    def __init__(self, *layers: dict, **settings):
        """`settings`: ProxySettings' fields in their groups; `layers` merged under them
        (tests.harness.merged), so a shared group dict and one more setting of its group combine."""
        self.p1, self.p2, self.d = StandinBehaviour(), StandinBehaviour(), StandinBehaviour()
        self.settings = merged(*layers, settings)

    def __enter__(self):
        self.servers = [ThreadServer(create_standin(b)).__enter__() for b in (self.p1, self.p2, self.d)]
        urls = [s.url for s in self.servers]
        settings = ProxySettings(
            prefill_urls=urls[:2],
            decode_urls=urls[2:],
            **merged({"routing": {"prefill_policy": "round_robin"}, "retries": {"backoff_s": 0.01}}, self.settings),
        )
        self.proxy = proxy_server(settings).__enter__()
        self.app = self.proxy.server.config.app
        self.url = self.proxy.url
        return self

    def __exit__(self, *exc):
        self.proxy.__exit__(*exc)
        for server in self.servers:
            server.__exit__(*exc)


def sample(metrics: str, name: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


class Fleet:
    """`prefill` prefill and `decode` decode stand-ins, each exporting `worker_info`, behind
    a real proxy with `settings`."""

    def __init__(self, prefill: int, decode: int, worker_info: dict | None = None, *layers: dict, **settings):
        self.prefills = [StandinBehaviour(worker_info=worker_info) for _ in range(prefill)]
        self.decodes = [StandinBehaviour(worker_info=worker_info) for _ in range(decode)]
        self.settings = merged(*layers, settings)

    def __enter__(self):
        self.servers = [ThreadServer(create_standin(b)).__enter__() for b in self.prefills + self.decodes]
        urls = [s.url for s in self.servers]
        n = len(self.prefills)
        self.proxy = proxy_server(
            ProxySettings(prefill_urls=urls[:n], decode_urls=urls[n:], **self.settings)
        ).__enter__()
        self.app = self.proxy.server.config.app
        self.url = self.proxy.url
        return self

    def __exit__(self, *exc):
        self.proxy.__exit__(*exc)
        for server in self.servers:
            server.__exit__(*exc)


def outstanding(cluster: Cluster | Fleet) -> list[int]:
    """Every worker's in-flight count as the proxy keeps it (prefill pool first)."""
    return [w.outstanding for pool in cluster.app.state.pools for w in pool.workers]


def queued_prefill_s(fleet: Fleet, worker: int = 0) -> float | None:
    """The prefill time admission counts queued on a prefill worker (its metric, None before
    its first reading)."""
    return sample(
        httpx.get(fleet.url + "/metrics").text,
        f'pdspec_proxy_prefill_queued_seconds{{worker="{fleet.servers[worker].url}"}}',
    )


class ProcessCluster:
    """Two prefill stand-ins and one decode stand-in behind a real proxy of `workers`
    processes, started as the benchmarks and `pdspec up` start it (`python -m pdspec.cli
    proxy`, its settings in PDSPEC_PROXY), with served-by headers, so each reply names the
    process that served it; the proxy's log in `log_path`."""

    def __init__(self, log_path: Path, *layers: dict, workers: int = 2, **settings):
        self.p1, self.p2, self.d = StandinBehaviour(), StandinBehaviour(), StandinBehaviour()
        self.log_path = log_path
        self.workers = workers
        self.settings = merged({"observability": {"served_by_headers": True}}, *layers, settings)

    def __enter__(self):
        self.servers = [ThreadServer(create_standin(b)).__enter__() for b in (self.p1, self.p2, self.d)]
        urls = [s.url for s in self.servers]
        self.port = unused_port()
        settings = merged(
            {"routing": {"prefill_policy": "round_robin"}, "retries": {"backoff_s": 0.01}},
            {"workers": self.workers, "prefill_urls": urls[:2], "decode_urls": urls[2:]},
            self.settings,
        )
        self.proxy = start_proxy(self.port, self.log_path, **settings)
        self.url = self.proxy.url
        wait_healthy(self.url, self.proxy.process, self.log_path, path="/ready")
        assert wait_for(lambda: len(self.listening()) == self.workers, timeout_s=30), self.log_tail()
        return self

    def __exit__(self, *exc):
        self.proxy.stop()
        for server in self.servers:
            server.__exit__(*exc)

    @property
    def parent(self) -> psutil.Process:
        return psutil.Process(self.proxy.process.pid)

    def processes(self) -> list[psutil.Process]:
        """The parent's processes (the proxy's own), running or not yet reaped."""
        try:
            return self.parent.children()
        except psutil.NoSuchProcess:
            return []

    def listening(self) -> list[psutil.Process]:
        """The proxy's processes that listen on its port (each binds its own socket)."""
        out = []
        for process in self.processes():
            try:
                sockets = process.net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                continue
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in sockets):
                out.append(process)
        return out

    def served_by(self, method: str, path: str, **kwargs) -> tuple[httpx.Response, str]:
        """A request on a fresh connection (the kernel picks its process anew), and which
        process answered it."""
        with httpx.Client(timeout=kwargs.pop("timeout", 20)) as client:
            response = client.request(method, self.url + path, **kwargs)
        return response, response.headers[PROCESS_HEADER]

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]
