"""A `pdspec up` of a profile, with settings overrides, as a benchmark's stack.

Overrides travel as pdspec's own environment variables (`prefill.port` ->
PDSPEC_PREFILL__PORT), which beat the profile file and lose to nothing else here, so the
stack started is exactly the settings computed in this process (`settings`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pdspec.settings import CONFIG_ENV, ENV_PREFIX, UpCommand


def env_name(key: str) -> str:
    return ENV_PREFIX + "__".join(part.upper() for part in key.split("."))


def env_value(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)  # numbers, booleans (true/false), lists, tables


def override_env(profile: Path | None, overrides: dict[str, object]) -> dict[str, str]:
    env = {env_name(key): env_value(value) for key, value in overrides.items()}
    if profile is not None:
        env[CONFIG_ENV] = str(Path(profile).resolve())
    return env


def _is_setting(name: str) -> bool:
    # PDSPEC_HOME only moves the default folders; every other PDSPEC_* name could be a
    # setting left in this shell, which would leak into the stack.
    return name.startswith(ENV_PREFIX) and name != "PDSPEC_HOME"


def load_settings(profile: Path | None, overrides: dict[str, object]) -> UpCommand:
    """The settings `pdspec up` will run with: profile, then these overrides."""
    wanted = override_env(profile, overrides)
    saved = {name: os.environ.pop(name) for name in list(os.environ) if _is_setting(name)}
    os.environ.update(wanted)
    try:
        return UpCommand()
    finally:
        for name in wanted:
            os.environ.pop(name, None)
        os.environ.update(saved)


def stack_ports(base: int, index: int) -> dict[str, int]:
    """Ports of stack `index` of a run: proxy (or colocated server), workers, NIXL side
    channels (each binds its port + DP rank, and `pdspec up` keeps four for each worker:
    supervisor.check_ports), KV-event ports. Distinct for up to 10 stacks."""
    return {
        "proxy.port": base + index,
        "colocated.port": base + index,
        "prefill.port": base + 10 + index,
        "decode.port": base + 20 + index,
        "prefill.side_channel_port": base + 200 + 8 * index,
        "decode.side_channel_port": base + 204 + 8 * index,
        # KV-event publishers; the replay endpoint is the next port up.
        "prefill.kv_events_port": base + 100 + 4 * index,
        "decode.kv_events_port": base + 102 + 4 * index,
    }


@dataclass
class Stack:
    name: str
    profile: Path | None
    overrides: dict[str, object]
    run_dir: Path
    process: subprocess.Popen | None = None

    @property
    def settings(self) -> UpCommand:
        return load_settings(self.profile, {**self.overrides, "run_dir": str(self.run_dir)})

    @property
    def log_path(self) -> Path:
        return self.run_dir / "pdspec-up.log"

    def urls(self) -> dict[str, str]:
        """Client URL, and the workers serve_bench reads (one server twice when colocated)."""
        from pdspec.supervisor import client_url

        s = self.settings
        if s.layout == "colocated":
            url = client_url(s)
            return {"url": url, "prefill_url": url, "decode_url": url}
        return {
            "url": client_url(s),
            "prefill_url": f"http://{s.prefill.host}:{s.prefill.port}",
            "decode_url": f"http://{s.decode.host}:{s.decode.port}",
        }

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {name: value for name, value in os.environ.items() if not _is_setting(name)}
        env.update(override_env(self.profile, {**self.overrides, "run_dir": str(self.run_dir)}))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pdspec.cli", "up"],
            env=env,
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        # For a clean-up that outlives this process (loadtest/gpu/serve_bench_2gpu.sh).
        (self.run_dir / "pdspec-up.pid").write_text(str(self.process.pid))

    def ready(self) -> bool:
        """True once `pdspec up` printed its ready line; raises if it exited first."""
        assert self.process is not None
        text = self.log_path.read_text(errors="replace")
        if "pdspec up: ready:" in text:
            return True
        if self.process.poll() is not None:
            raise RuntimeError(f"stack {self.name}: pdspec up exited ({self.process.returncode}):\n{self.log_tail()}")
        return False

    def log_tail(self, lines: int = 40) -> str:
        parts = [self.log_path.read_text(errors="replace").splitlines()[-lines:]]
        for log in sorted((self.run_dir / "logs").glob("*.log")):
            parts.append([f"--- {log.name} ---", *log.read_text(errors="replace").splitlines()[-lines:]])
        return "\n".join(line for part in parts for line in part)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def stop_all(stacks: list[Stack], timeout_s: float = 120.0) -> None:
    """SIGTERM to each `pdspec up` at once (each stops its own children, which run in
    their own process groups), then wait; SIGKILL a `pdspec up` that outlives the grace."""
    running = [s for s in stacks if s.running()]
    for stack in running:
        stack.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for stack in running:
        try:
            stack.process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(stack.process.pid, signal.SIGKILL)
            stack.process.wait(timeout=10)


def wait_ready(stacks: list[Stack], timeout_s: float, say=print) -> dict[str, float]:
    """Seconds each stack took to be ready; raises when one exits or time runs out."""
    started = time.monotonic()
    pending = list(stacks)
    ready_s = {}
    while pending:
        for stack in list(pending):
            if stack.ready():
                pending.remove(stack)
                ready_s[stack.name] = time.monotonic() - started
                say(f"stack {stack.name} ready after {ready_s[stack.name]:.0f} s")
        if pending and time.monotonic() - started > timeout_s:
            raise RuntimeError(
                "not ready in time: " + ", ".join(s.name for s in pending) + "\n" + pending[0].log_tail()
            )
        if pending:
            time.sleep(1.0)  # poll interval for the ready line
    return ready_s
