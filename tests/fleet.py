"""The 2P1D fleet of real workers that the cache-aware routing and fault modules share
(`fleet_2p1d` in tests/conftest.py): two prefill workers and one decode worker, KV events
on, prefix caching on, a KV lease of 20 s. Each module starts its own proxies in front of
it; starting the three workers once instead of once per module saves about 90 s each.

Its users run one after another (tests/conftest.py orders them: render routing, KV routing,
faults) and leave it serving, except the last: test_faults kills workers, then stops the
fleet when it ends. A module that restarts a worker does it through `restart`, so the
next module finds the worker where it was."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tests import harness

BASE = 19000  # workers 191xx (prefill), 192xx (decode); NIXL side channels 193xx, 194xx; KV events +1000
# A KV lease of 20 s (pdspec's default is 120): test_faults' refused-decode test waits for it.
LEASE_S = 20
# name: (role, HTTP port, NIXL side-channel port, VLLM_CPU_OMP_THREADS_BIND)
WORKERS = {
    "p1": ("prefill", BASE + 101, BASE + 301, "0"),
    "p2": ("prefill", BASE + 102, BASE + 302, "0"),
    "d": ("decode", BASE + 201, BASE + 401, "1"),
}


@dataclass
class Fleet:
    run: Path
    servers: dict[str, harness.Server] = field(default_factory=dict)

    def __getitem__(self, name: str) -> harness.Server:
        return self.servers[name]

    @property
    def prefill_urls(self) -> list[str]:
        return [self.servers["p1"].url, self.servers["p2"].url]

    @property
    def decode_urls(self) -> list[str]:
        return [self.servers["d"].url]

    @property
    def kv_source_ports(self) -> list[str]:
        """The prefill workers' NIXL side channels, as the proxy's `kv_transfer.source_ports` takes them."""
        return [f"{WORKERS['p1'][2]}-{WORKERS['p2'][2]}"]

    def log(self, name: str, run_dir: Path | None = None) -> Path:
        role, port, _, _ = WORKERS[name]
        return (run_dir or self.run / name) / f"{role}-{port}.log"

    def start(self, name: str, run_dir: Path | None = None) -> harness.Server:
        role, port, side_channel, cpu = WORKERS[name]
        server = harness.start_worker(
            role, run_dir or self.run / name, port, side_channel, cpu_omp_threads_bind=cpu, kv_lease_s=LEASE_S
        )
        self.servers[name] = server
        return server

    def restart(self, name: str) -> harness.Server:
        """`name` started again in place (same ports, a new engine with an empty cache), once
        its old process is gone; returns once it is healthy."""
        run_dir = self.run / f"{name}-restarted"
        server = self.start(name, run_dir)
        harness.wait_healthy(server.url, server.process, self.log(name, run_dir))
        return server

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def start_fleet(run: Path) -> Fleet:
    """All three workers started side by side; returns once each is healthy."""
    fleet = Fleet(run)
    try:
        for name in WORKERS:
            fleet.start(name)
        for name, server in fleet.servers.items():
            harness.wait_healthy(server.url, server.process, fleet.log(name))
    except BaseException:
        fleet.stop()
        raise
    return fleet
