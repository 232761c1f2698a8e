"""`pdspec up`: start the prefill workers, the decode workers and the proxy; stop them all.

One worker of each role by default; `--prefill.replicas N --decode.replicas M` starts an
xPyD fleet on one host (`replica_settings`: consecutive ports, cores or GPUs split).

Each child runs in its own process group (vLLM starts an engine-core process and
workers under it), so stopping a child means signalling its group, by the PID we got
from starting it, never by name. Readiness is each child's own health endpoint. On a GPU
build, workers that share a GPU start one after another (`start_waves`).

Supervision (`supervise`, pdspec/restarts.py): a child that exits is started again after
a backoff, its group's leftovers killed first (an orphaned engine core would hold the
worker's ports), its log appended to; too many exits in the window, or `restart =
"never"`, stop the stack with an error naming the child and the tail of its log. The
proxy takes a restarted worker back by itself, once its health and pairing checks pass.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from pdspec.restarts import RestartPolicy
from pdspec.settings import ModelSettings, ProxySettings, UpCommand, WorkerSettings

STOP_GRACE_S = 20.0


class StartupError(RuntimeError):
    pass


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    health_url: str
    log_path: Path
    process: subprocess.Popen | None = None
    # Run before every start, restarts included: a worker's fresh Prometheus folder (vLLM
    # needs it empty; a dead process's files would keep its gauges and counters alive).
    before_start: Callable[[], None] | None = None
    # The GPUs it runs on (None: none, or the CPU build): children sharing one start in turn.
    gpus: frozenset[str] | None = None
    # Its KV cache size is given (vLLM's --kv-cache-memory-bytes): the engine skips
    # measuring the GPU's free memory, so it may start beside others on its GPU.
    sized_kv: bool = False
    role: str | None = None  # a worker's role (prefill, decode, colocated); None for the proxy
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self, append: bool = False) -> None:
        if self.before_start is not None:
            self.before_start()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab" if append else "wb")
        self.process = subprocess.Popen(
            self.argv,
            env={**os.environ, **self.env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop it and all it started
        )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float) -> None:
        if self.process is None:
            return
        self.signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        # The group leader may be gone while its children linger: kill the group anyway.
        self.signal_group(signal.SIGKILL)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self._log is not None:
            self._log.close()
            self._log = None


def plan_children(settings: UpCommand) -> list[Child]:
    from pdspec.worker.launch import is_cpu_build, launch_spec, prepare_run_dir

    cpu = is_cpu_build()

    if settings.layout == "colocated":
        roles = (("colocated", settings.colocated),)
    else:
        roles = (("prefill", settings.prefill), ("decode", settings.decode))
    children = []
    for role, base in roles:
        replicas = replica_settings(base) if role != "colocated" else [base]
        for index, worker in enumerate(replicas):
            name = replica_name(role, index, len(replicas))
            run_dir = replica_run_dir(settings.run_dir, role, index)
            prepare_run_dir(role, run_dir)  # before launch_spec: it names files in there
            spec = launch_spec(role, settings.model, worker, run_dir)
            children.append(
                Child(
                    name=f"{name} worker",
                    argv=spec.argv,
                    env=spec.env,
                    health_url=f"http://{worker.host}:{worker.port}/health",
                    log_path=settings.run_dir / "logs" / f"{name}.log",
                    before_start=functools.partial(prepare_run_dir, role, run_dir),
                    gpus=None if cpu else worker_gpus(worker),
                    sized_kv=explicit_kv_size(worker),
                    role=role,
                )
            )
    if settings.layout == "colocated":
        return children  # clients talk to the one server itself
    proxy = proxy_settings_for(settings)
    children.append(
        Child(
            name="proxy",
            argv=[sys.executable, "-m", "pdspec.cli", "proxy"],
            env={"PDSPEC_PROXY": proxy.model_dump_json()},
            # Ready, not just alive: the proxy itself sees a healthy worker of each pool.
            health_url=f"http://{proxy.host}:{proxy.port}/ready",
            log_path=settings.run_dir / "logs" / "proxy.log",
        )
    )
    return children


def replica_name(role: str, index: int, count: int) -> str:
    """A worker's name in logs and run folders: the role alone, or `<role>-<i>` in a fleet."""
    return role if count == 1 else f"{role}-{index}"


def worker_gpus(worker: WorkerSettings) -> frozenset[str]:
    """The GPUs a worker's engine uses: its CUDA_VISIBLE_DEVICES, or GPU 0 when unset (where
    vLLM puts a one-GPU engine, so two unset workers share it)."""
    return frozenset((worker.cuda_visible_devices or "0").split(","))


def explicit_kv_size(worker: WorkerSettings) -> bool:
    """True when the worker's vLLM arguments give its KV cache size in bytes
    (`--kv-cache-memory-bytes`): vLLM 0.33 then skips its memory profile (it still runs
    one dummy forward pass) and never reads the GPU's free memory after start-up."""
    return any(
        arg == "--kv-cache-memory-bytes" or arg.startswith("--kv-cache-memory-bytes=") for arg in worker.extra_vllm_args
    )


def start_waves(children: list[Child]) -> list[list[Child]]:
    """The order `pdspec up` starts its children in: a worker sharing a GPU with an earlier
    one starts only once that one is ready (two vLLM engines measuring one GPU's free
    memory at once fail: "No available memory for the cache blocks"); the others at once.
    Workers whose KV size is given (`sized_kv`) measure nothing, so they do not wait for
    each other; they still wait for, and are waited for by, workers that measure.
    Children without a GPU (the proxy; every child on the CPU build) start with the last
    wave: the proxy's readiness needs the workers anyway, and on the CPU there is one wave."""
    waves: list[list[Child]] = [[]]
    placed: dict[str, int] = {}  # child name -> its wave
    on_gpus = [c for c in children if c.gpus is not None]
    for child in on_gpus:
        wave = max(
            (
                placed[o.name] + 1
                for o in on_gpus
                if o.name in placed and o.gpus & child.gpus and not (o.sized_kv and child.sized_kv)
            ),
            default=0,
        )
        placed[child.name] = wave
        while len(waves) <= wave:
            waves.append([])
        waves[wave].append(child)
    waves[-1] += [c for c in children if c.gpus is None]
    return waves


def replica_settings(base: WorkerSettings) -> list[WorkerSettings]:
    """The settings of each replica of a role: replica i on port + i, side_channel_port
    + 4i (NIXL adds the rank to it) and kv_events_port + 2i (the replay port is next);
    the role's cores and GPUs split evenly when there are enough for each replica, else
    shared."""
    n = base.replicas
    cores = _split(_expand(base.cpu_omp_threads_bind), n, "-")
    gpus = _split((base.cuda_visible_devices or "").split(",") if base.cuda_visible_devices else [], n, ",")
    return [
        base.model_copy(
            update={
                "replicas": 1,
                "port": base.port + i,
                "side_channel_port": base.side_channel_port + 4 * i,
                "kv_events_port": base.kv_events_port + (base.kv_events_replay_offset + 1) * i,
                "cpu_omp_threads_bind": cores[i] if cores else base.cpu_omp_threads_bind,
                "cuda_visible_devices": gpus[i] if gpus else base.cuda_visible_devices,
            }
        )
        for i in range(n)
    ]


def replica_run_dir(run_dir: Path, role: str, index: int) -> Path:
    """Replica 0 keeps the role's own place (so `pdspec drafts` finds a 1P1D worker as
    before); replica i > 0 gets `<run_dir>/replicas/<role>-<i>`."""
    return run_dir if index == 0 else run_dir / "replicas" / f"{role}-{index}"


def _expand(spec: str | None) -> list[str]:
    """'0-3' or '0,2,4' as a list of core numbers; [] for none or a form not split here."""
    if not spec or "|" in spec:
        return []
    cores: list[str] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return []
        cores += [str(c) for c in range(int(low), int(high or low) + 1)]
    return cores


def _split(items: list[str], n: int, joiner: str) -> list[str]:
    """`items` in n even consecutive groups (as VLLM_CPU_OMP_THREADS_BIND or
    CUDA_VISIBLE_DEVICES values), or [] when there are fewer items than groups."""
    if n == 1 or len(items) < n:
        return []
    size = len(items) // n
    groups = [items[i * size : (i + 1) * size] for i in range(n)]
    if joiner == "-":  # a contiguous group as a range, any other as a list
        return [
            f"{g[0]}-{g[-1]}" if int(g[-1]) - int(g[0]) == len(g) - 1 and len(g) > 1 else ",".join(g) for g in groups
        ]
    return [joiner.join(g) for g in groups]


def check_ports(settings: UpCommand) -> None:
    """No two ports of the fleet the same: HTTP, NIXL side channels (with 4 for DP ranks),
    KV-event publishers and their replay endpoints, the proxy."""
    used: dict[int, str] = {}

    def claim(port: int, what: str) -> None:
        if port in used:
            raise StartupError(f"port {port} is both {used[port]} and {what}: move a base port or use fewer replicas")
        used[port] = what

    claim(settings.proxy.port, "the proxy's")
    for role, base in (("prefill", settings.prefill), ("decode", settings.decode)):
        for i, worker in enumerate(replica_settings(base)):
            name = f"{role}-{i}"
            claim(worker.port, f"{name}'s HTTP port")
            for rank in range(4):
                claim(worker.side_channel_port + rank, f"{name}'s NIXL side channel (+{rank})")
            if worker.kv_events:
                claim(worker.kv_events_port, f"{name}'s KV events")
                claim(worker.kv_events_port + worker.kv_events_replay_offset, f"{name}'s KV-event replay")


def kv_transfer_advice(children: list[Child], settings: UpCommand) -> str | None:
    """A warning for prefill and decode workers that share a GPU and pull: with no NVLink
    between them UCX serves NIXL's READ over TCP (0.44 GB/s measured on one H200)."""
    if settings.layout == "colocated" or settings.model.kv_transfer != "pull":
        return None
    prefill = [c for c in children if c.gpus is not None and c.role == "prefill"]
    decode = [c for c in children if c.gpus is not None and c.role == "decode"]
    shared = sorted({g for p in prefill for d in decode for g in p.gpus & d.gpus})
    if not shared:
        return None
    return (
        f"warning: prefill and decode workers share GPU {','.join(shared)} and pull their KV; with no NVLink "
        "between them UCX reads it over TCP (0.44 GB/s measured on one H200). Set model.kv_transfer to push "
        "(deploy/profiles/one-gpu-1p1d.toml does)."
    )


def proxy_settings_for(settings: UpCommand) -> ProxySettings:
    """The proxy `up` starts talks to the workers `up` starts, and tokenizes with the
    tokenizer of the model they serve (`routing.tokenizer`, unless it is set)."""
    prefills, decodes = replica_settings(settings.prefill), replica_settings(settings.decode)
    first, last = prefills[0].side_channel_port, prefills[-1].side_channel_port
    kv_transfer = settings.proxy.kv_transfer
    ports = [*kv_transfer.source_ports, str(first) if first == last else f"{first}-{last}"]
    routing = settings.proxy.routing
    if routing.tokenizer is None:
        routing = routing.model_copy(update={"tokenizer": served_tokenizer(settings.model)})
    return settings.proxy.model_copy(
        update={
            "prefill_urls": [f"http://{w.host}:{w.port}" for w in prefills],
            "decode_urls": [f"http://{w.host}:{w.port}" for w in decodes],
            "kv_transfer": kv_transfer.model_copy(update={"source_ports": ports}),
            "routing": routing,
        }
    )


def served_tokenizer(model: ModelSettings) -> Path | None:
    """The folder of the target model the workers serve, when it is a local folder with a
    tokenizer.json (the local model's, once installed); None for a Hugging Face name, whose
    files the workers fetch themselves (the proxy then asks a worker's /tokenize)."""
    from pdspec.worker.launch import resolve_model_paths

    target = Path(resolve_model_paths(model)[0]).expanduser()
    return target if (target / "tokenizer.json").is_file() else None


def client_url(settings: UpCommand) -> str:
    """Where clients send requests: the proxy, or the colocated server."""
    if settings.layout == "colocated":
        return f"http://{settings.colocated.host}:{settings.colocated.port}"
    proxy = proxy_settings_for(settings)
    return f"http://{proxy.host}:{proxy.port}"


def wait_ready(children: list[Child], timeout_s: float, say) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(children)
    started = time.monotonic()
    with httpx.Client(timeout=2.0) as client:
        while pending:
            for child in list(pending):
                code = child.exited()
                if code is not None:
                    raise StartupError(
                        f"{child.name} exited with code {code} before it was ready; "
                        f"last lines of {child.log_path}:\n{child.log_tail()}"
                    )
                try:
                    if client.get(child.health_url).status_code == 200:
                        pending.remove(child)
                        say(f"{child.name} ready after {time.monotonic() - started:.0f}s")
                except httpx.TransportError:
                    pass
            if pending and time.monotonic() > deadline:
                names = ", ".join(child.name for child in pending)
                raise StartupError(f"not ready after {timeout_s:.0f}s: {names}")
            if pending:
                time.sleep(0.5)  # poll interval between health checks, not a readiness guess


def supervise(
    children: list[Child],
    policy: RestartPolicy,
    say,
    on_restart=lambda name: None,
    tick_s: float = 1.0,
    clock=time.monotonic,
    sleep=time.sleep,
) -> None:
    """Watch the running children until the process is told to stop; raises StartupError
    when a child exited and may not be restarted."""
    due: dict[str, float] = {}  # child name -> when it starts again
    while True:
        now = clock()
        for child in children:
            if child.name in due:
                if now >= due[child.name]:
                    del due[child.name]
                    child.start(append=True)
                    on_restart(child.name)
                    say(f"restarted {child.name} (pid {child.pid})")
                continue
            code = child.exited()
            if code is None:
                continue
            pause = policy.after_exit(child.name, now)
            if pause is None:
                times = (
                    f" {policy.exits_in_window(child.name)} times in {policy.window_s:.0f}s" if policy.enabled else ""
                )
                raise StartupError(f"{child.name} exited with code {code}{times}:\n{child.log_tail()}")
            child.stop(0)  # what it started goes with it
            say(f"{child.name} exited with code {code}; restarting it in {pause:.0f}s")
            due[child.name] = now + pause
        sleep(tick_s)  # supervision tick


def restart_counter(port: int | None):
    """pdspec_supervisor_restarts_total{child}, served on 127.0.0.1:`port`; None: not served."""
    if port is None:
        return lambda name: None
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    registry = CollectorRegistry()
    restarts = Counter(
        "pdspec_supervisor_restarts",
        "Children `pdspec up` started again after they exited.",
        ["child"],
        registry=registry,
    )
    start_http_server(port, addr="127.0.0.1", registry=registry)
    return lambda name: restarts.labels(name).inc()


class _Stop(Exception):
    pass


def _raise_stop(signum, frame) -> None:
    raise _Stop()


def run_up(settings: UpCommand) -> int:
    def say(message: str) -> None:
        print(f"pdspec up: {message}", flush=True)

    from pdspec.worker.preflight import PreflightError, check_environment

    try:
        check_environment()
    except PreflightError as exc:
        say(f"error: {exc}")
        return 1
    if settings.model.target is None:
        from pdspec.models.build import install_models, is_installed

        if not is_installed(settings.model.models_dir):
            say(f"installing the local model pair in {settings.model.models_dir}")
        install_models(settings.model.models_dir)

    try:
        if settings.layout != "colocated":
            check_ports(settings)
    except StartupError as exc:
        say(f"error: {exc}")
        return 1
    children = plan_children(settings)
    advice = kv_transfer_advice(children, settings)
    if advice:
        say(advice)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for wave in start_waves(children):
            for child in wave:
                child.start()
                say(f"started {child.name} (pid {child.pid}, log {child.log_path})")
            wait_ready(wave, settings.ready_timeout_s, say)
        say(f"ready: {client_url(settings)}")
        policy = RestartPolicy(
            settings.restart == "on-failure",
            settings.max_restarts,
            settings.restart_window_s,
            settings.restart_backoff_s,
        )
        supervise(children, policy, say, restart_counter(settings.metrics_port))
    except _Stop:
        say("stopping")
        return 0
    except StartupError as exc:
        say(f"error: {exc}")
        return 1
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        # Proxy first, so no new request reaches a worker that is going away.
        for child in reversed(children):
            child.stop(STOP_GRACE_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        say("stopped")
