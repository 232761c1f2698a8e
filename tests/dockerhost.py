"""Docker's engine and docker-compose for the deployment tests, installed from Debian
when missing (CI starts on a bare machine) and started when not running. The engine is
stopped again at the end only if these tests started it."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

APT_PACKAGES = {
    "docker": "docker.io",
    "dockerd": "docker.io",
    "docker-compose": "docker-compose",
    "mmdebstrap": "mmdebstrap",
}
DOCKERD_LOG = Path("/tmp/pdspec-tests-dockerd.log")


def ensure_tools(*names: str) -> None:
    """apt-get install the Debian packages that provide the missing commands."""
    missing = sorted({APT_PACKAGES[n] for n in names if shutil.which(n) is None and not _sbin(n)})
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        check=True,
        env=env,
        capture_output=True,
    )


def _sbin(name: str) -> bool:
    return any(Path(d, name).exists() for d in ("/usr/sbin", "/sbin"))


def engine_running() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def start_engine(timeout_s: float = 60.0) -> subprocess.Popen | None:
    """Start dockerd unless an engine answers; returns the process it started, if any."""
    if engine_running():
        return None
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    proc = subprocess.Popen([dockerd], stdout=DOCKERD_LOG.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine_running():
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"dockerd exited with {proc.returncode}; see {DOCKERD_LOG}")
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"dockerd did not answer within {timeout_s} s; see {DOCKERD_LOG}")


def stop_engine(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ImageBuild:
    """`make images` (the CPU image, built locally: tens of seconds to minutes) started in the
    background when the session collects the compose test, so the build overlaps the tests
    before it instead of adding to the suite's time. It installs Docker's tools and starts
    the engine first, as the compose test would. `result()` waits for it and returns the
    engine it started (None if one was running), or raises with the failing step's output;
    `stop()` stops that engine at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.engine: subprocess.Popen | None = None
        self.build_s: float | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pdspec-image-build", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            ensure_tools("docker", "dockerd", "docker-compose", "mmdebstrap")
            self.engine = start_engine()
            start = time.monotonic()
            out = subprocess.run(["make", "images"], cwd=self.root, capture_output=True, text=True, timeout=3600)
            if out.returncode != 0:
                raise RuntimeError(
                    f"make images failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
                )
            self.build_s = round(time.monotonic() - start, 1)
        except BaseException as exc:  # reported to the test that needs the image
            self._error = exc

    def result(self, timeout_s: float = 3600) -> subprocess.Popen | None:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError(f"make images still running after {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self.engine

    def stop(self) -> None:
        self._thread.join(3600)
        stop_engine(self.engine)
