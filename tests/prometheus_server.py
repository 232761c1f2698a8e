"""A real Prometheus server for the tests: Debian's `prometheus` binary (installed by
`make test`), started on a free loopback port with its own configuration and data folder
under a temporary directory, stopped by its PID. The Debian package's own service is
never used.

The configuration is the shipped one (deploy/prometheus/prometheus.yml: its job names
and rules), with targets read from files the test writes (so it can add a target
later), 1-second scrape and evaluation intervals, and a copy of the rules whose `for:`
is 0s, so an alert fires at its first true evaluation (the shipped durations are
covered by `promtool test rules`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from deploy.prometheus.promql import REPO, Prometheus

SHIPPED_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
RULES_DIR = REPO / "deploy" / "prometheus" / "rules"
INTERVAL = "1s"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` not found: `make test` installs Debian's prometheus package")
    return path


def fast_rules(source: Path, dest: Path) -> None:
    """The shipped rules with every `for:` set to 0s."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.yml")):
        data = yaml.safe_load(path.read_text())
        for group in data["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = "0s"
        (dest / path.name).write_text(yaml.safe_dump(data, sort_keys=False))


class PrometheusServer:
    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None
        self.api = Prometheus(self.url)

    def targets_file(self, job: str) -> Path:
        return self.folder / "targets" / f"{job}.json"

    def set_targets(self, job: str, targets: list[str]) -> None:
        """Prometheus watches these files: a change takes effect within a second or so."""
        path = self.targets_file(job)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": targets}]))
        tmp.replace(path)

    def write_config(self, targets: dict[str, list[str]]) -> Path:
        shipped = yaml.safe_load(SHIPPED_CONFIG.read_text())
        (self.folder / "targets").mkdir(parents=True, exist_ok=True)
        fast_rules(RULES_DIR, self.folder / "rules")
        jobs = []
        for job in shipped["scrape_configs"]:
            name = job["job_name"]
            self.set_targets(name, targets.get(name, []))
            jobs.append(
                {
                    "job_name": name,
                    "file_sd_configs": [{"files": [str(self.targets_file(name))], "refresh_interval": "1s"}],
                }
            )
        config = {
            "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": [str(self.folder / "rules" / "*.yml")],
            "scrape_configs": jobs,
        }
        path = self.folder / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(self, targets: dict[str, list[str]], timeout_s: float = 60) -> None:
        config = self.write_config(targets)
        log = open(self.folder / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("prometheus exited:\n" + (self.folder / "prometheus.log").read_text()[-3000:])
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)  # poll interval
        raise RuntimeError("prometheus not ready in time")

    def start_scraping(self, proxy_url: str, prefill_urls: list[str], decode_urls: list[str]) -> None:
        """Start, scraping a proxy and its workers (jobs pdspec-proxy, -prefill, -decode), and
        return once every one of them was scraped up."""
        targets = {
            "pdspec-proxy": [proxy_url],
            "pdspec-prefill": list(prefill_urls),
            "pdspec-decode": list(decode_urls),
        }
        self.start({job: [url.removeprefix("http://") for url in urls] for job, urls in targets.items()})
        count = sum(map(len, targets.values()))
        self.wait_for(
            'count(up{job=~"pdspec-.*"} == 1)',
            lambda r: r and float(r[0]["value"][1]) == count,
            what=f"all {count} targets scraped",
        )

    def wait_for(self, expr: str, predicate, timeout_s: float = 60, what: str = ""):
        """Polls an instant query until `predicate(result)` holds; returns the result."""
        deadline = time.monotonic() + timeout_s
        result = None
        while time.monotonic() < deadline:
            result = self.api.query(expr)
            if predicate(result):
                return result
            time.sleep(0.5)  # poll interval
        raise AssertionError(f"timed out waiting for {what or expr}: last result {result}")

    def stop(self) -> None:
        self.api.close()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # by the PID we started, never by name
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
