"""Start real pdspec stacks and vLLM servers for the end-to-end tests, and read /metrics.

Like vLLM's nixl_integration tests: a harness starts P, D and the proxy (here through
`pdspec up` itself, so the tests cover the command users run), and tests assert on
real responses and on the workers' own /metrics.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from loadtest.serving import worker_metrics

REPO = Path(__file__).resolve().parents[1]
# The session fixtures' ports (tests/conftest.py): the colocated reference server, then the stack.
REFERENCE_PORT = 18900
STACK_BASE_PORT = 18000
STARTUP_TIMEOUT_S = float(os.environ.get("PDSPEC_TEST_STARTUP_TIMEOUT_S", "600"))


# Every way a started worker is told its engine cache (`engine_cache_dir` of the worker groups
# of `pdspec up`, `pdspec prefill` and `pdspec decode`): the end-to-end session sets them all
# to one folder (tests/e2e/conftest.py), so only the first worker pays vLLM's model inspection.
ENGINE_CACHE_ENV = tuple(f"PDSPEC_{group}__ENGINE_CACHE_DIR" for group in ("PREFILL", "DECODE", "COLOCATED", "WORKER"))


def models_dir() -> Path:
    """The model pair the tests use: built once by `make test` (`pdspec models`)."""
    from pdspec.settings import ModelSettings

    return ModelSettings().models_dir


@dataclass
class Stack:
    """A running `pdspec up`: its process, its URLs and its log."""

    process: subprocess.Popen
    proxy_url: str
    prefill_url: str
    decode_url: str
    run_dir: Path
    output: list[str] = field(default_factory=list)

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout_s: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)


# The shared test stack's settings (tests/conftest.py), for tests that start a stack of
# their own to compare with it: a small prefill budget, so long prompts arrive in several
# chunks (as in the seed); no prefix caching on either worker, so a prompt sent twice is
# prefilled and transferred twice; the test hooks on (pdspec/worker/engine/testing_hooks.py).
NO_PREFIX_CACHE = '["--no-enable-prefix-caching"]'
# A KV lease of 30 s (vLLM's default; pdspec's is 120 s): the observability test waits for
# a prefill's KV to expire unread.
TEST_STACK_ARGS = [
    "--prefill.max_num_batched_tokens",
    "512",
    "--prefill.test_hooks",
    "--decode.test_hooks",
    "--prefill.extra_vllm_args",
    NO_PREFIX_CACHE,
    "--decode.extra_vllm_args",
    NO_PREFIX_CACHE,
    "--prefill.kv_lease_s",
    "30",
    "--decode.kv_lease_s",
    "30",
]


def start_stack(run_dir: Path, base_port: int, extra_args: list[str] = ()) -> Stack:
    """`pdspec up` on test ports; returns once it printed its ready line."""
    proxy_port, prefill_port, decode_port = base_port, base_port + 100, base_port + 200
    argv = [
        sys.executable,
        "-m",
        "pdspec.cli",
        "up",
        "--model.models_dir",
        str(models_dir()),
        "--run_dir",
        str(run_dir),
        "--proxy.port",
        str(proxy_port),
        "--prefill.port",
        str(prefill_port),
        "--decode.port",
        str(decode_port),
        "--prefill.side_channel_port",
        str(base_port + 300),
        "--decode.side_channel_port",
        str(base_port + 400),
        "--prefill.kv_events_port",
        str(base_port + 500),
        "--decode.kv_events_port",
        str(base_port + 600),
        *extra_args,
    ]
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    stack = Stack(
        process,
        proxy_url=f"http://127.0.0.1:{proxy_port}",
        prefill_url=f"http://127.0.0.1:{prefill_port}",
        decode_url=f"http://127.0.0.1:{decode_port}",
        run_dir=run_dir,
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    assert process.stdout is not None
    for line in process.stdout:  # `pdspec up` prints "ready: <url>" once all are healthy
        stack.output.append(line.rstrip())
        if line.startswith("pdspec up: ready:"):
            break
        if time.monotonic() > deadline:
            stack.stop()
            raise RuntimeError("pdspec up not ready in time:\n" + "\n".join(stack.output))
    else:
        raise RuntimeError("pdspec up exited before ready:\n" + "\n".join(stack.output) + _logs(run_dir))
    return stack


def _logs(run_dir: Path) -> str:
    parts = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-40:]
        parts.append(f"\n--- {log.name} ---\n" + "\n".join(tail))
    return "".join(parts)


@dataclass
class Server:
    process: subprocess.Popen
    url: str

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, not a shutdown."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def start_worker(role: str, run_dir: Path, port: int, side_channel_port: int = 5600, **worker: object) -> Server:
    """One vLLM worker through pdspec's launcher: prefill, decode or colocated."""
    from pdspec.settings import ModelSettings
    from pdspec.worker.launch import ROLE_SETTINGS, launch_spec, prepare_run_dir

    prepare_run_dir(role, run_dir)
    # KV-event ports apart from every other worker's: tests start a role's workers on
    # consecutive side-channel ports and the roles 100 apart, so the replay port is 50 up.
    # No core binding unless asked (the role classes' defaults bind `pdspec up`'s cores).
    worker = {
        "kv_events_port": side_channel_port + 1000,
        "kv_events_replay_offset": 50,
        "cpu_omp_threads_bind": None,
        "engine_cache_dir": os.environ.get("PDSPEC_WORKER__ENGINE_CACHE_DIR"),
        **worker,
    }
    settings = ROLE_SETTINGS[role](port=port, side_channel_port=side_channel_port, **worker)
    spec = launch_spec(role, ModelSettings(models_dir=models_dir()), settings, run_dir)
    log_path = run_dir / f"{role}-{port}.log"
    process = subprocess.Popen(
        spec.argv,
        env={**os.environ, **spec.env},
        stdout=open(log_path, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Server(process, f"http://127.0.0.1:{port}")


def start_colocated(run_dir: Path, port: int) -> Server:
    """One plain vLLM server with the same model and drafter, no KV transfer."""
    server = start_worker("colocated", run_dir, port)
    wait_healthy(server.url, server.process, run_dir / f"colocated-{port}.log")
    return server


def merged(*layers: dict) -> dict:
    """Proxy settings in their nested groups, later layers over earlier ones, group by group
    (`merged(common, {"routing": {...}})` keeps common's other routing settings)."""
    out: dict = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def start_proxy(port: int, log_path: Path | None = None, **settings: object) -> Server:
    """A proxy on `port` with `settings` (ProxySettings' fields, in their groups:
    `routing={"prefill_policy": ...}`), checked here before the proxy starts; its log goes
    to `log_path` (none if None)."""
    import json

    from pdspec.settings import ProxySettings

    settings = {"port": port, **settings}
    ProxySettings.model_validate(settings)  # a misspelt or misplaced setting fails the test here, named
    env = {**os.environ, "PDSPEC_PROXY": json.dumps(settings)}
    log = open(log_path, "wb") if log_path is not None else subprocess.DEVNULL
    process = subprocess.Popen(
        [sys.executable, "-m", "pdspec.cli", "proxy"],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    if log_path is not None:
        log.close()  # the child has its own copy
    return Server(process, f"http://127.0.0.1:{port}")


def wait_healthy(url: str, process: subprocess.Popen, log_path: Path | None = None, path: str = "/health") -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:] if log_path else ""
            raise RuntimeError(f"server exited: {tail}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)  # poll interval
    raise RuntimeError(f"{url} not healthy in time")


def scrape(url: str) -> dict[str, float]:
    """A worker's /metrics as {sample name: value}, summing over label sets.

    Sample names keep their suffixes (`_total`, `_sum`, `_count`), so counters and
    histogram sums can be read directly.
    """
    return worker_metrics.parse(httpx.get(url + "/metrics", timeout=10).text)


def stream_and_kill(url: str, body: dict, kill, after_events: int = 3, timeout_s: float = 60) -> list[str]:
    """Streams `body` to `url`'s /v1/completions, calls `kill()` once `after_events` SSE
    data events have arrived, and returns the data of every event received to the end."""
    events: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=timeout_s) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[len("data: ") :])
            if len(events) == after_events:
                kill()
    return events


def scrape_labeled(url: str, name: str) -> dict[tuple, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def gauges(url: str) -> tuple[float | None, float | None]:
    """(requests running or waiting, KV cache usage); None until the engine first logs them."""
    values = scrape(url)
    running = values.get("vllm:num_requests_running")
    waiting = values.get("vllm:num_requests_waiting")
    busy = None if running is None or waiting is None else running + waiting
    return busy, values.get("vllm:kv_cache_usage_perc")


def wait_for(condition, timeout_s: float = 30, poll_s: float = 0.2) -> bool:
    """Whether `condition()` held within `timeout_s` (polled every `poll_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


def wait_idle(url: str, timeout_s: float = 30) -> tuple[float | None, float | None]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy, usage = gauges(url)
        if busy == 0 and usage == 0:
            return busy, usage
        time.sleep(0.2)  # poll interval
    return gauges(url)


def worker_pids(stack) -> dict[str, int]:
    """The vLLM server processes `pdspec up` started (children of the up process)."""
    pids = {}
    for child in psutil.Process(stack.process.pid).children():
        cmdline = " ".join(child.cmdline())
        port = stack.prefill_url.rsplit(":", 1)[1]
        if "pdspec.worker.serve" in cmdline:
            pids["prefill" if f"--port {port}" in cmdline else "decode"] = child.pid
    assert set(pids) == {"prefill", "decode"}, pids
    return pids
