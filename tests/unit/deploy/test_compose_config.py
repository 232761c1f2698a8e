"""docker-compose.yml: `docker-compose config` succeeds for every profile, and the
services are wired: each worker's port is the one the proxy's dns:// entry, the health
check and `expose` name; the NIXL side channel port is exposed; the proxy starts after
healthy workers and is published on 127.0.0.1 only; every pdspec command and PDSPEC_*
variable is one pdspec's settings accept. (The stack itself runs in tests/e2e/test_compose.py.)"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tests import dockerhost
from tests.deploy_wiring import ROOT, settings_problems

PROFILES = ("cpu", "gpu", "monitoring")
WORKERS = {"cpu": ("prefill", "decode", "proxy"), "gpu": ("prefill-gpu", "decode-gpu", "proxy-gpu")}


def config(*profiles: str) -> dict:
    dockerhost.ensure_tools("docker-compose")
    args = [a for p in profiles for a in ("--profile", p)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDSPEC_")}
    out = subprocess.run(
        ["docker-compose", "-p", "pdspec", *args, "config"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, f"docker-compose --profile {profiles} config:\n{out.stderr}"
    resolved = yaml.safe_load(out.stdout)
    # docker-compose 1.29 prints every service whatever the profiles; keep the profiles' own.
    resolved["services"] = {
        n: svc for n, svc in resolved["services"].items() if set(svc.get("profiles", [])) & set(profiles)
    }
    return resolved


@pytest.mark.parametrize("profile", PROFILES)
def test_config_succeeds_for_every_profile(profile):
    services = config(profile)["services"]
    expected = {"cpu": set(WORKERS["cpu"]), "gpu": set(WORKERS["gpu"]), "monitoring": {"prometheus", "grafana"}}
    assert set(services) == expected[profile]


def dns_port(url_list: str, name: str) -> int:
    (url,) = yaml.safe_load(url_list)
    host, port = url.removeprefix("dns://").split(":")
    assert url.startswith("dns://") and host == name
    return int(port)


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_services_are_wired(profile):
    services = config(profile)["services"]
    prefill, decode, proxy = (services[name] for name in WORKERS[profile])
    proxy_env = proxy["environment"]
    for name, service, variable in (
        ("prefill", prefill, "PDSPEC_PROXY__PREFILL_URLS"),
        ("decode", decode, "PDSPEC_PROXY__DECODE_URLS"),
    ):
        port = int(service["environment"]["PDSPEC_WORKER__PORT"])
        side = int(service["environment"]["PDSPEC_WORKER__SIDE_CHANNEL_PORT"])
        assert dns_port(proxy_env[variable], name) == port
        assert service["healthcheck"]["test"] == ["CMD", "pdspec-healthcheck", f"http://127.0.0.1:{port}/health"]
        assert {str(port), str(side)} <= set(map(str, service["expose"]))
        assert service["environment"]["PDSPEC_WORKER__HOST"] == "0.0.0.0"
        # The service name (or its alias) is what compose's DNS answers for the proxy.
        aliases = (service.get("networks") or {}).get("default", {}) or {}
        assert name in {*(aliases.get("aliases") or []), *[k for k, v in services.items() if v is service]}
        assert service["init"] is True and service["shm_size"]
    assert {dep: cond["condition"] for dep, cond in proxy["depends_on"].items()} == {
        WORKERS[profile][0]: "service_healthy",
        WORKERS[profile][1]: "service_healthy",
    }
    # Published on the loopback interface only (1.29 prints the short form, v2 the long one).
    assert proxy["ports"] in (
        ["127.0.0.1:8000:8000/tcp"],
        [{"host_ip": "127.0.0.1", "published": "8000", "target": 8000, "mode": "ingress", "protocol": "tcp"}],
    )
    assert proxy["healthcheck"]["test"] == ["CMD", "pdspec-healthcheck", "http://127.0.0.1:8000/ready"]


def test_gpu_workers_each_get_their_own_gpu():
    services = config("gpu")["services"]
    ids = [services[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for n in WORKERS["gpu"][:2]]
    assert ids == [["0"], ["1"]]


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_every_pdspec_variable_and_command_is_accepted_by_pdspec(profile):
    for name, service in config(profile)["services"].items():
        assert (
            settings_problems(
                service["command"] if isinstance(service["command"], str) else service["command"][0],
                service["environment"],
            )
            == []
        ), name


def test_monitoring_mounts_files_that_exist_or_are_expected():
    services = config("monitoring")["services"]
    mounts = [
        v["source"] if isinstance(v, dict) else v.split(":")[0] for s in services.values() for v in s.get("volumes", [])
    ]
    local = [m for m in mounts if m.startswith(str(ROOT))]
    assert str(ROOT / "deploy/compose/prometheus.yml") in local
    assert (ROOT / "deploy/compose/prometheus.yml").is_file()
    assert (ROOT / "deploy/compose/grafana/provisioning/datasources/prometheus.yml").is_file()
    # Written by the observability work: the rules and the dashboard both deployments ship.
    assert str(ROOT / "deploy/prometheus/rules") in local
    assert str(ROOT / "deploy/grafana/pdspec-dashboard.json") in local
