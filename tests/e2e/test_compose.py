"""docker-compose.yml's cpu profile, brought up for real with Docker's engine through
`make compose-up` (images built locally, no registry), then: completions and a
streamed chat through the proxy on 127.0.0.1:8000, the prefill container proposing
with K=0 in every step, `--scale prefill=2` with traffic reaching both prefill
containers, a crashed prefill container restarted by compose and readmitted by the proxy,
the decode container killed mid-stream (an SSE error event, no hang), and
`make compose-down` leaving no container, network or volume behind.

Docker's engine, docker-compose and mmdebstrap are installed from Debian when missing,
and the engine is started (and stopped again) when it is not running. Everything here
must run under the machine-wide lock (`flock /tmp/pdspec-e2e.lock`), like every test
that starts vLLM workers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest

from tests import harness
from tests.deploy_wiring import ROOT
from tests.prompts import CHAT_MESSAGES, chat_body, completion_body, unique_prompt

pytestmark = pytest.mark.after_stack

PROJECT = "pdspec-test"
PROXY = "http://127.0.0.1:8000"
PREFILL_PORT, DECODE_PORT = 8100, 8200
READY_TIMEOUT_S = 900
# make's variables: a project of its own, so a developer's `pdspec` project is left alone.
MAKE_VARS = [f"COMPOSE_PROJECT={PROJECT}", "PROXY_PORT=8000"]
COMPOSE = ["docker-compose", "-p", PROJECT, "--profile", "cpu"]
COMPOSE_ENV = {**os.environ, "PDSPEC_CPU_IMAGE": "pdspec:cpu", "PDSPEC_PROXY_PORT": "8000"}
RESULTS = ROOT / "runs" / "compose.json"


def run(cmd: list[str], timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert out.returncode == 0, (
        f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out


def port_free(port: int) -> bool:
    """Whether a server could listen on `port` now. With SO_REUSEADDR, as servers bind (uvicorn
    does): connections the proxy closed itself (idle keep-alive ones, after
    clients.idle_timeout_s) leave TIME_WAIT entries on the port for a minute, which are not a
    process left behind."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def containers(service: str | None = None, all_states: bool = False) -> list[str]:
    cmd = ["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"]
    if service:
        cmd += ["--filter", f"label=com.docker.compose.service={service}"]
    if all_states:
        cmd.append("-a")
    return run(cmd).stdout.split()


def address(container: str) -> str:
    return run(
        ["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container]
    ).stdout.strip()


def health(container: str) -> str:
    return run(["docker", "inspect", "-f", "{{.State.Health.Status}}", container]).stdout.strip()


def project_leftovers() -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return {
        "containers": run(["docker", "ps", "-aq", "--filter", label]).stdout.split(),
        "networks": run(["docker", "network", "ls", "-q", "--filter", label]).stdout.split(),
        "volumes": run(["docker", "volume", "ls", "-q", "--filter", label]).stdout.split(),
    }


def logs() -> str:
    out = subprocess.run(
        [*COMPOSE, "logs", "--no-color", "--tail", "40"], cwd=ROOT, env=COMPOSE_ENV, capture_output=True, text=True
    )
    return out.stdout[-6000:]


@pytest.fixture(scope="module")
def compose_stack(image_build):
    if not port_free(8000):
        pytest.fail(
            "127.0.0.1:8000 is in use: the compose test publishes the proxy there (make compose-up); "
            "stop whatever listens on it and run again"
        )
    # Docker's tools, its engine and `make images` ran in the background since collection
    # (tests/conftest.py: image_build); the engine is stopped at the session's end if it
    # was started for these tests.
    image_build.result()
    measured: dict[str, float] = {"build_s": image_build.build_s}
    try:
        run(["make", "compose-down", *MAKE_VARS])  # a previous run's leftovers, if any
        run(["make", "images"], timeout=3600)  # up to date already: checks it, in seconds
        measured["image_bytes"] = int(run(["docker", "image", "inspect", "-f", "{{.Size}}", "pdspec:cpu"]).stdout)
        start = time.monotonic()
        try:
            run(
                ["make", "compose-up", *MAKE_VARS, f"COMPOSE_READY_TIMEOUT_S={READY_TIMEOUT_S}"],
                timeout=READY_TIMEOUT_S + 600,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- compose logs ---\n{logs()}") from None
        measured["up_to_ready_s"] = round(time.monotonic() - start, 1)
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(measured, indent=2) + "\n")
        print(f"compose: {measured}")
        yield measured
    finally:
        subprocess.run(["make", "compose-down", *MAKE_VARS], cwd=ROOT, capture_output=True, timeout=600)


def test_completion_and_streamed_chat_through_the_proxy(compose_stack):
    with httpx.Client(timeout=120) as client:
        reply = client.post(PROXY + "/v1/completions", json=completion_body("def read_config(path):"))
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"]
        assert reply.json()["usage"]["completion_tokens"] > 0
        events = []
        with client.stream("POST", PROXY + "/v1/chat/completions", json=chat_body(CHAT_MESSAGES[0], stream=True)) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(
        json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1] if json.loads(e)["choices"]
    )
    assert text


def test_prefill_container_proposes_with_k0_in_every_step(compose_stack):
    (prefill,) = containers("prefill")
    before = harness.scrape(f"http://{address(prefill)}:{PREFILL_PORT}")
    with httpx.Client(timeout=120) as client:
        for _ in range(3):
            assert client.post(PROXY + "/v1/completions", json=completion_body(unique_prompt(200))).status_code == 200
    after = harness.scrape(f"http://{address(prefill)}:{PREFILL_PORT}")
    proposals = after["pdspec_proposals_total"] - before.get("pdspec_proposals_total", 0)
    k0 = after["pdspec_k0_proposals_total"] - before.get("pdspec_k0_proposals_total", 0)
    assert proposals >= 3 and k0 == proposals, (k0, proposals)


def test_scale_prefill_to_two_and_traffic_reaches_both(compose_stack):
    run([*COMPOSE, "up", "-d", "--no-recreate", "--scale", "prefill=2"], env=COMPOSE_ENV, timeout=READY_TIMEOUT_S)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        prefills = containers("prefill")
        if len(prefills) == 2 and all(health(c) == "healthy" for c in prefills):
            break
        assert time.monotonic() < deadline, f"two healthy prefill containers expected:\n{logs()}"
        time.sleep(2)
    urls = [f"http://{address(c)}:{PREFILL_PORT}" for c in prefills]
    served = {url: harness.scrape(url).get("vllm:request_success_total", 0) for url in urls}
    # The proxy re-resolves dns://prefill every 5 s and admits the new worker after its
    # health checks; distinct prompts spread over both (prefix affinity hashes prompts).
    deadline = time.monotonic() + 180
    with httpx.Client(timeout=120) as client:
        while not all(harness.scrape(url).get("vllm:request_success_total", 0) > served[url] for url in urls):
            assert time.monotonic() < deadline, "traffic did not reach both prefill containers"
            reply = client.post(PROXY + "/v1/completions", json=completion_body(unique_prompt(20), max_tokens=4))
            assert reply.status_code == 200, reply.text


def healthy_prefill_workers() -> float:
    return harness.scrape_labeled(PROXY, "pdspec_proxy_healthy_workers").get((("pool", "prefill"),), 0.0)


def inspect(container: str, field: str) -> str:
    return run(["docker", "inspect", "-f", "{{" + field + "}}", container]).stdout.strip()


def test_a_crashed_prefill_container_restarts_and_takes_traffic_again(compose_stack):
    """A crash, not a `docker kill` (Docker does not restart a container stopped by hand):
    the container's own process is killed from the host, by its PID. `restart:
    unless-stopped` starts it again, its health check decides when it is back, the proxy
    readmits it, and prefill legs reach it with their KV pulled over NIXL again."""
    prefills = containers("prefill")
    assert len(prefills) == 2, "runs after the scale test"
    crashed = prefills[0]
    restarts_before = int(inspect(crashed, ".RestartCount"))
    os.kill(int(inspect(crashed, ".State.Pid")), 9)
    deadline = time.monotonic() + READY_TIMEOUT_S
    ejected = False
    while not (
        int(inspect(crashed, ".RestartCount")) > restarts_before
        and health(crashed) == "healthy"
        and healthy_prefill_workers() == 2
    ):
        ejected = ejected or healthy_prefill_workers() < 2
        assert time.monotonic() < deadline, f"the crashed prefill container did not come back:\n{logs()}"
        time.sleep(2)
    assert ejected, "the proxy never took the crashed worker out of its pool"
    url = f"http://{address(crashed)}:{PREFILL_PORT}"
    (decode,) = containers("decode")
    decode_url = f"http://{address(decode)}:{DECODE_PORT}"
    moved_before = harness.scrape(decode_url).get("vllm:nixl_bytes_transferred_sum", 0.0)
    deadline = time.monotonic() + 180
    with httpx.Client(timeout=120) as client:
        while harness.scrape(url).get("vllm:request_success_total", 0) == 0:  # a fresh process: counters from 0
            assert time.monotonic() < deadline, "traffic did not reach the restarted prefill container"
            reply = client.post(PROXY + "/v1/completions", json=completion_body(unique_prompt(200), max_tokens=4))
            assert reply.status_code == 200, reply.text
    assert harness.scrape(decode_url).get("vllm:nixl_bytes_transferred_sum", 0.0) > moved_before


def test_decode_container_killed_mid_stream_ends_with_an_sse_error(compose_stack):
    """SIGKILL straight to the container's init process from the host, not `docker kill`:
    the CLI's round trip through a busy engine once took long enough (CI) for the whole
    1,500-token stream to finish first."""
    (decode,) = containers("decode")
    init_pid = int(inspect(decode, ".State.Pid"))
    body = completion_body(unique_prompt(40), stream=True, max_tokens=1900, ignore_eos=True)
    start = time.monotonic()
    events = harness.stream_and_kill(PROXY, body, kill=lambda: os.kill(init_pid, signal.SIGKILL))
    assert time.monotonic() - start < 60
    assert events[-1] == "[DONE]"
    assert "error" in json.loads(events[-2])


def test_compose_down_leaves_nothing(compose_stack):
    assert containers(all_states=True)
    run(["make", "compose-down", *MAKE_VARS])
    assert project_leftovers() == {"containers": [], "networks": [], "volumes": []}
    assert port_free(8000)
