"""The proxy across cores: `proxy.workers` = N > 1 processes on one port.

How they are made. `pdspec proxy` with N > 1 (pdspec/cli.py; N = 1 is `proxy.serve.serve`,
one process and no parent) runs `run_processes`: a parent that serves nothing. It checks
that the port is free, makes a fresh folder for the processes' metrics, and starts N
processes (`python -m proxy.processes`, each given its settings and slot in its
environment). Each binds a socket of its own to the port with SO_REUSEPORT and listens
once its app has started (proxy/serve.py's `serve_process`); the kernel spreads new
connections over the listening sockets by a hash of each connection's addresses: evenly
over many connections, not by load, and a connection stays with its process. (uvicorn's
own `workers` instead shares one socket, which its processes compete to accept on, and
needs the app as an import string.)

Why the port check: with SO_REUSEPORT a second proxy (of the same user) could join this
one's port and silently take part of its connections; the parent first binds the port
without it, which fails while anything listens there, as one process's bind does.

Supervision. The parent waits until every process listens (each says so through a pipe).
A process that exits before that stops the proxy, exit status 1: a port taken, a setting
the process refuses; restarting would not help. Once it serves, a process that exits is
started again in its slot after `RESTART_BACKOFF_S`, doubling with each exit of that slot
within `RESTART_WINDOW_S` (pdspec/restarts.py, as `pdspec up` restarts its children); the
others serve meanwhile. Its requests in flight are lost; new connections go to the others
until it listens again. More than `MAX_RESTARTS` exits of one slot within the window stop
the proxy with exit status 1, for whatever runs it (`pdspec up`, compose, Kubernetes) to
act on. A process that hangs without exiting is not noticed here.

Stopping. SIGTERM or SIGINT to the parent sends SIGTERM to every process, each finishing
its requests in flight for up to `proxy.serve.GRACEFUL_SHUTDOWN_S` as one process does;
one still running after `STOP_GRACE_S` is killed; the parent removes the metrics folder
and exits 0, also when the signal comes while the processes start (a process the group's
signal reaches before it listens is stopped, not failed). The processes stay in the parent's process group, so a signal to the group
(`pdspec up` stopping its children, a terminal's Ctrl-C) reaches them too, and each gets
SIGTERM when the parent dies (Linux's PR_SET_PDEATHSIG), so not even a killed parent
leaves one serving; its metrics folder goes when the next proxy starts (`fresh_metrics_dir`).

State. Each process is a whole proxy: its own worker pools, health checks and pairing
check, KV-event subscriptions and index, routing policies' state, admission queue and KV
room, worker connections. Nothing on a request's path crosses processes (sharing the index
or the health state would put a lock or a hop between processes on every request). The
limits that count requests and connections are divided among the processes
(`settings_for_process`), so a limit set for the proxy holds for it as a whole. Metrics are
shared: a scrape of any process answers for all of them (proxy/shared_metrics.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from pdspec.restarts import RestartPolicy
from pdspec.settings import ProxySettings
from proxy.logs import configure_logging

log = logging.getLogger("pdspec.proxy.processes")

# A process's slot, settings and parent, in its environment (JSON).
SLOT_ENV = "PDSPEC_PROXY_PROCESS"
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # where prometheus_client keeps a process's values
LISTENING = b"L"  # what a process writes to its pipe once it listens
METRICS_DIR_PREFIX = "pdspec-proxy-metrics-"  # then the parent's pid

MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0
RESTART_BACKOFF_S = 1.0
# After SIGTERM: proxy.serve.GRACEFUL_SHUTDOWN_S (5 s) for the requests in flight, then
# time to close; a process still running is killed.
STOP_GRACE_S = 10.0
# A process that cannot start (its port taken, say), as uvicorn's own start-up failure.
STARTUP_FAILURE = 3

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def settings_for_process(settings: ProxySettings, index: int) -> ProxySettings:
    """Process `index`'s settings: the proxy's, with its share of the limits that count
    requests and connections (admission.max_inflight, admission.max_queue,
    clients.max_connections: as even as they divide, the first processes one more, so the
    shares sum to the limit) and `workers` = 1, since it is one process."""
    count = settings.workers

    def share(limit: int) -> int:
        return limit // count + (1 if index < limit % count else 0)

    admission, clients = settings.admission, settings.clients
    return settings.model_copy(
        update={
            "workers": 1,
            "admission": admission.model_copy(
                update={"max_inflight": share(admission.max_inflight), "max_queue": share(admission.max_queue)}
            ),
            "clients": clients.model_copy(update={"max_connections": share(clients.max_connections)}),
        }
    )


def _addresses(host: str, port: int) -> list[tuple[int, tuple]]:
    """The (family, address) pairs a server on host:port binds, as asyncio's create_server
    (which uvicorn uses for one process) resolves them."""
    infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    return list(dict.fromkeys((family, address) for family, _, _, _, address in infos))


def _bound_socket(family: int, address: tuple, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's servers
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio's servers
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def check_port_free(host: str, port: int) -> None:
    """Raises OSError when anything listens on host:port (another proxy's processes included)."""
    for family, address in _addresses(host, port):
        _bound_socket(family, address, reuse_port=False).close()


def shared_port_sockets(host: str, port: int) -> list[socket.socket]:
    """This process's own sockets on host:port, bound with SO_REUSEPORT, not yet listening."""
    sockets: list[socket.socket] = []
    try:
        for family, address in _addresses(host, port):
            sockets.append(_bound_socket(family, address, reuse_port=True))
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def run_processes(settings: ProxySettings) -> int:
    """Run the proxy as `settings.workers` processes until SIGTERM or SIGINT (the module's
    docstring); the exit status: 0 when stopped, 1 when a process could not start or kept
    exiting, STARTUP_FAILURE when the port is taken."""
    configure_logging(settings.observability.log_level, settings.observability.log_format)
    try:
        check_port_free(settings.host, settings.port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", settings.host, settings.port, exc)
        return STARTUP_FAILURE
    metrics_dir = fresh_metrics_dir()
    try:
        return asyncio.run(ProxyProcesses(settings, metrics_dir).run())
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def fresh_metrics_dir() -> Path:
    """A new folder for the processes' metrics, named after this parent, in the temporary
    folder (TMPDIR); the folders of parents no longer running (killed before they could
    remove theirs) are removed first, so restarts of a killed proxy leave none behind."""
    for stale in Path(tempfile.gettempdir()).glob(f"{METRICS_DIR_PREFIX}*"):
        pid = stale.name.removeprefix(METRICS_DIR_PREFIX).partition("-")[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-"))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


@dataclass
class _Slot:
    index: int
    process: asyncio.subprocess.Process | None = None


class ProxyProcesses:
    """The parent: starts the processes, starts again one that exits, stops them all."""

    # What a process runs: this module's `main`.
    command: tuple[str, ...] = (sys.executable, "-m", "proxy.processes")

    def __init__(self, settings: ProxySettings, metrics_dir: Path, restarts: RestartPolicy | None = None) -> None:
        self.settings = settings
        self.metrics_dir = metrics_dir
        self.slots = [_Slot(i) for i in range(settings.workers)]
        self.restarts = restarts or RestartPolicy(
            max_restarts=MAX_RESTARTS, window_s=RESTART_WINDOW_S, backoff_s=RESTART_BACKOFF_S
        )
        self.failed = False

    async def run(self) -> int:
        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        listening = await asyncio.gather(*(self._start(slot) for slot in self.slots))
        if self.stopping.is_set():
            # Stopped while starting: a signal to the process group (`kill -TERM -PGID`, an
            # init system) reaches a process before it listens too, and that is a stop, not
            # a failure.
            log.info("stopped while the proxy processes started")
        elif not all(listening):
            log.error("a proxy process exited before it listened: stopping the proxy")
            self.failed = True
        else:
            pids = ", ".join(str(slot.process.pid) for slot in self.slots)
            log.info(
                "%d proxy processes on %s:%d (pids %s)", len(self.slots), self.settings.host, self.settings.port, pids
            )
            watchers = [asyncio.create_task(self._keep_running(slot)) for slot in self.slots]
            await self.stopping.wait()
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        await self._stop_all()
        return 1 if self.failed else 0

    async def _start(self, slot: _Slot) -> bool:
        """Starts the slot's process; True once it listens, False if it exited first."""
        read_end, write_end = os.pipe()
        description = {
            "index": slot.index,
            "parent_pid": os.getpid(),
            "listening_fd": write_end,
            "settings": settings_for_process(self.settings, slot.index).model_dump(mode="json"),
        }
        env = {**os.environ, METRICS_DIR_ENV: str(self.metrics_dir), SLOT_ENV: json.dumps(description)}
        pipe = os.fdopen(read_end, "rb", buffering=0)
        try:
            slot.process = await asyncio.create_subprocess_exec(
                *self.command, env=env, stdin=asyncio.subprocess.DEVNULL, pass_fds=(write_end,)
            )
        except BaseException:
            pipe.close()
            raise
        finally:
            os.close(write_end)  # the process holds the only write end: its exit ends the read below
        reader = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
        try:
            return await reader.read(1) == LISTENING
        finally:
            transport.close()

    async def _keep_running(self, slot: _Slot) -> None:
        """Starts the slot's process again each time it exits, until the proxy stops."""
        while True:
            assert slot.process is not None
            status = await slot.process.wait()
            if self.stopping.is_set():
                return
            mark_process_dead(slot.process.pid, str(self.metrics_dir))  # its gauges leave the scrape
            pause = self.restarts.after_exit(f"process {slot.index}", time.monotonic())
            if pause is None:
                log.error(
                    "proxy process %d (pid %d) exited with status %s, its %d exits within %.0f s: stopping the proxy",
                    slot.index,
                    slot.process.pid,
                    status,
                    self.restarts.exits_in_window(f"process {slot.index}"),
                    RESTART_WINDOW_S,
                )
                self.failed = True
                self.stopping.set()
                return
            log.warning(
                "proxy process %d (pid %d) exited with status %s: starting it again in %.1f s",
                slot.index,
                slot.process.pid,
                status,
                pause,
            )
            try:
                await asyncio.wait_for(self.stopping.wait(), pause)
                return
            except asyncio.TimeoutError:
                pass
            if await self._start(slot):
                log.info("proxy process %d listens again (pid %d)", slot.index, slot.process.pid)

    async def _stop_all(self) -> None:
        running = [slot.process for slot in self.slots if slot.process is not None and slot.process.returncode is None]
        for process in running:
            _signal(process, signal.SIGTERM)
        if not running:
            return
        _, late = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in running], timeout=STOP_GRACE_S)
        if late:
            log.warning("%d proxy processes still running %.0f s after SIGTERM: killing them", len(late), STOP_GRACE_S)
        for process in running:
            if process.returncode is None:
                _signal(process, signal.SIGKILL)
                await process.wait()


def _signal(process: asyncio.subprocess.Process, sig: int) -> None:
    """`os.kill`, not `process.send_signal`: that polls first, which reaps a process that
    has just exited from under asyncio's child watcher (it then reports status 255)."""
    try:
        os.kill(process.pid, sig)
    except ProcessLookupError:
        pass


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM to this process when its parent dies (Linux), so a killed parent leaves no
    process serving; exits at once if the parent is already gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        sys.exit(1)


def main() -> None:
    """`python -m proxy.processes`: one process of the proxy, as the parent started it."""
    slot = json.loads(os.environ.pop(SLOT_ENV))
    _die_with_parent(slot["parent_pid"])
    settings = ProxySettings.model_validate(slot["settings"])
    try:
        sockets = shared_port_sockets(settings.host, settings.port)
    except OSError as exc:
        configure_logging(settings.observability.log_level, settings.observability.log_format)
        log.error("proxy process %d cannot bind %s:%d: %s", slot["index"], settings.host, settings.port, exc)
        sys.exit(STARTUP_FAILURE)
    listening_fd = slot["listening_fd"]

    def listening() -> None:
        os.write(listening_fd, LISTENING)
        os.close(listening_fd)

    # Imported here: the parent, which imports this module too, serves nothing.
    from proxy.serve import serve_process

    serve_process(settings, slot["index"], sockets, Path(os.environ[METRICS_DIR_ENV]), listening)


if __name__ == "__main__":
    main()
