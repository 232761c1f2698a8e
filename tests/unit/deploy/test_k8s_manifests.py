"""Kubernetes manifests (deploy/k8s): every overlay renders with `kubectl kustomize`,
every object validates against the Kubernetes schemas (kubernetes-validate) or, for the
Prometheus Operator's custom resources, against their own (the CRD-generated models of
cloudcoil-models-prometheus-operator), and the objects are wired to each other:
Services select the right pods, ports, probes and the NIXL side channel agree, the
NetworkPolicies let only the proxy reach the workers' HTTP ports and only workers reach
each other's NIXL ports, and every PDSPEC_* variable is a setting pdspec accepts."""

from __future__ import annotations

import importlib.util
import sys

import kubernetes_validate
import pytest
import yaml

from tests.deploy_wiring import ROOT, settings_problems
from tests.k8s_render import K8S, objects, render

OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
KUBERNETES_VERSION = "1.37.0"
WORKERS = ("prefill", "decode")
POD_IP = "10.1.2.3"
# Custom resources, checked against their CRDs' models rather than the Kubernetes schemas.
CUSTOM_API_GROUPS = ("monitoring.coreos.com/", "keda.sh/")


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def container(deployment: dict) -> dict:
    (c,) = pod_spec(deployment)["containers"]
    return c


def named_ports(c: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def config_maps(overlay: str) -> dict[str, dict]:
    return {name: cm.get("data", {}) for name, cm in objects(overlay, "ConfigMap").items()}


def container_env(overlay: str, deployment: dict) -> dict[str, str]:
    """The container's environment as Kubernetes builds it (envFrom, then env with
    $(VAR) expansion; the pod IP stands in for status.podIP)."""
    c = container(deployment)
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(config_maps(overlay)[source["configMapRef"]["name"]])
    for item in c.get("env", []):
        if "value" in item:
            value = item["value"]
            for name, known in env.items():
                value = value.replace(f"$({name})", known)
            env[item["name"]] = value
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[item["name"]] = POD_IP
    return env


def selects(selector: dict, labels: dict) -> bool:
    match = selector.get("matchLabels", selector)
    return all(labels.get(k) == v for k, v in match.items())


def deployments_selected(overlay: str, selector: dict) -> set[str]:
    return {
        name
        for name, d in objects(overlay, "Deployment").items()
        if selects(selector, d["spec"]["template"]["metadata"]["labels"])
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_whole_deployment(overlay):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render(overlay)}
    for expected in [
        ("Deployment", "prefill"),
        ("Deployment", "decode"),
        ("Deployment", "proxy"),
        ("Service", "prefill"),
        ("Service", "decode"),
        ("Service", "proxy"),
        ("PodDisruptionBudget", "prefill"),
        ("PodDisruptionBudget", "decode"),
        ("PodDisruptionBudget", "proxy"),
        ("NetworkPolicy", "pdspec-workers"),
        ("PodMonitor", "pdspec"),
        ("PrometheusRule", "pdspec"),
        ("ConfigMap", "pdspec-dashboard"),
    ]:
        assert expected in kinds, f"{overlay}: {expected} missing"
    assert all(o["metadata"].get("namespace") == "pdspec" for o in render(overlay) if o["kind"] != "Namespace")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_validate_against_the_kubernetes_schemas(overlay):
    checked = 0
    for obj in render(overlay):
        if obj["apiVersion"].startswith(CUSTOM_API_GROUPS):
            continue  # checked against their own CRDs below
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 15


def _unknown_keys(given, parsed, path="") -> list[str]:
    if isinstance(given, dict):
        return [
            p
            for key, value in given.items()
            for p in (
                [f"{path}.{key}"]
                if not isinstance(parsed, dict) or key not in parsed
                else _unknown_keys(value, parsed[key], f"{path}.{key}")
            )
        ]
    if isinstance(given, list) and isinstance(parsed, list):
        return [p for i, (g, q) in enumerate(zip(given, parsed)) for p in _unknown_keys(g, q, f"{path}[{i}]")]
    return []


def _strict_custom(model_cls, obj: dict) -> None:
    """Validate with the CRD's model and refuse keys the schema does not know (the models
    drop unknown keys, so a key lost in the round trip is a misspelt field)."""
    parsed = model_cls.model_validate(obj).model_dump(by_alias=True, exclude_none=True, mode="json")
    assert _unknown_keys(obj, parsed) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_custom_resources_validate_against_their_crds(overlay):
    from cloudcoil.models.keda import v1alpha1 as keda
    from cloudcoil.models.prometheus_operator import v1

    for obj in objects(overlay, "PodMonitor").values():
        _strict_custom(v1.PodMonitor, obj)
    for obj in objects(overlay, "PrometheusRule").values():
        _strict_custom(v1.PrometheusRule, obj)
    for obj in objects(overlay, "ScaledObject").values():
        _strict_custom(keda.ScaledObject, obj)
    custom = [o for o in render(overlay) if o["apiVersion"].startswith(CUSTOM_API_GROUPS)]
    assert {o["kind"] for o in custom} <= {"PodMonitor", "PrometheusRule", "ScaledObject"}


def test_strict_custom_resource_check_catches_a_misspelt_field():
    from cloudcoil.models.prometheus_operator import v1

    good = objects("cpu", "PodMonitor")["pdspec"]
    bad = yaml.safe_load(yaml.safe_dump(good))
    bad["spec"]["podMetricsEndpoints"][0]["portName"] = bad["spec"]["podMetricsEndpoints"][0].pop("port")
    with pytest.raises(AssertionError):
        _strict_custom(v1.PodMonitor, bad)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_select_their_own_pods_and_ports(overlay):
    deployments = objects(overlay, "Deployment")
    for name, service in objects(overlay, "Service").items():
        assert deployments_selected(overlay, service["spec"]["selector"]) == {name}, f"Service {name}"
        ports = named_ports(container(deployments[name]))
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {name}: no container port {port['targetPort']}"
            assert ports[port["targetPort"]] == port["port"], f"Service {name}: port {port['port']}"
    for role in WORKERS:
        # Headless, ready pods only: DNS then lists exactly the workers the proxy may use.
        assert objects(overlay, "Service")[role]["spec"]["clusterIP"] == "None"
        assert not objects(overlay, "Service")[role]["spec"].get("publishNotReadyAddresses", False)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_proxy_membership_names_the_worker_services(overlay):
    proxy_env = container_env(overlay, objects(overlay, "Deployment")["proxy"])
    services = objects(overlay, "Service")
    for role, variable in (("prefill", "PDSPEC_PROXY__PREFILL_URLS"), ("decode", "PDSPEC_PROXY__DECODE_URLS")):
        (url,) = yaml.safe_load(proxy_env[variable])
        host, port = url.removeprefix("dns://").split(":")
        assert url.startswith("dns://") and host == role
        assert int(port) in [p["port"] for p in services[role]["spec"]["ports"] if p["name"] == "http"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_worker_ports_probes_and_side_channel_agree(overlay):
    for role in WORKERS:
        deployment = objects(overlay, "Deployment")[role]
        c = container(deployment)
        env = container_env(overlay, deployment)
        ports = named_ports(c)
        assert c["args"] == [role]
        assert int(env["PDSPEC_WORKER__PORT"]) == ports["http"]
        assert int(env["PDSPEC_WORKER__SIDE_CHANNEL_PORT"]) == ports["nixl"] == int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        # Advertised at the pod's own IP, so the other worker can reach it.
        assert env["PDSPEC_WORKER__SIDE_CHANNEL_HOST"] == POD_IP == env["VLLM_NIXL_SIDE_CHANNEL_HOST"]
        assert env["PDSPEC_WORKER__HOST"] == "0.0.0.0"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, f"{role} {probe}"
        startup = c["startupProbe"]
        # An engine that loads for minutes is not killed: startup allows 20+ minutes.
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200
        shm = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == "shm")
        assert shm["emptyDir"]["medium"] == "Memory"
        assert any(m["mountPath"] == "/dev/shm" and m["name"] == "shm" for m in c["volumeMounts"])
    proxy = container(objects(overlay, "Deployment")["proxy"])
    assert proxy["args"] == ["proxy"] and proxy["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_bounded_and_unprivileged(overlay):
    for name, deployment in objects(overlay, "Deployment").items():
        c = container(deployment)
        assert c["resources"]["requests"] and c["resources"]["limits"].get("memory"), name
        assert pod_spec(deployment)["securityContext"]["runAsNonRoot"] is True, name
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
        if overlay.startswith("gpu") and name in WORKERS:
            assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pdspec_variable_and_command_is_accepted_by_pdspec(overlay):
    for name, deployment in objects(overlay, "Deployment").items():
        (command,) = container(deployment)["args"]
        assert settings_problems(command, container_env(overlay, deployment)) == [], name


def test_a_renamed_setting_is_caught():
    env = container_env("cpu", objects("cpu", "Deployment")["prefill"])
    env["PDSPEC_WORKER__SIDECHANNEL_PORT"] = env.pop("PDSPEC_WORKER__SIDE_CHANNEL_PORT")
    assert settings_problems("prefill", env) == [
        "PDSPEC_WORKER__SIDECHANNEL_PORT: no such setting for `pdspec prefill`"
    ]
    assert settings_problems("serve", {}) == ["`pdspec serve` is not a pdspec command"]


def test_xpyd_differs_from_1p1d_only_in_replica_counts():
    one, many = render("gpu-1p1d"), render("gpu-xpyd")
    replicas = {}
    for a, b in zip(one, many, strict=True):
        if a != b:
            assert a["kind"] == "Deployment" and {**a, "spec": {**a["spec"], "replicas": 0}} == {
                **b,
                "spec": {**b["spec"], "replicas": 0},
            }
            replicas[a["metadata"]["name"]] = (a["spec"]["replicas"], b["spec"]["replicas"])
    assert replicas == {"prefill": (1, 2), "decode": (1, 2)}


# --- NetworkPolicy: who may reach which port ----------------------------------------------


def _port_matches(rule_port: dict, dest: dict, port: int) -> bool:
    named = named_ports(container(dest))
    start = named.get(rule_port["port"]) if isinstance(rule_port["port"], str) else rule_port["port"]
    return start is not None and start <= port <= rule_port.get("endPort", start)


def _peer_matches(peer: dict, labels: dict) -> bool:
    """A `from` entry and a source pod in the pdspec namespace (an ipBlock may be any pod)."""
    if "ipBlock" in peer:
        return True
    namespace_ok = selects(peer.get("namespaceSelector", {}), {"kubernetes.io/metadata.name": "pdspec"})
    return namespace_ok and selects(peer.get("podSelector", {}), labels)


def allowed(overlay: str, source: str, dest: str, port: int) -> bool:
    """Would a pod of Deployment `source` reach `port` on a pod of `dest` (same namespace)?
    Kubernetes' rule: unrestricted unless a policy selects the pod; then any rule of any
    selecting policy may allow it."""
    deployments = objects(overlay, "Deployment")
    src_labels = deployments[source]["spec"]["template"]["metadata"]["labels"]
    dst_labels = deployments[dest]["spec"]["template"]["metadata"]["labels"]
    policies = [
        p
        for p in objects(overlay, "NetworkPolicy").values()
        if "Ingress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], dst_labels)
    ]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            peer_ok = peers is None or any(_peer_matches(peer, src_labels) for peer in peers)
            ports = rule.get("ports")
            port_ok = ports is None or any(_port_matches(p, deployments[dest], port) for p in ports)
            if peer_ok and port_ok:
                return True
    return False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_only_proxy_reaches_worker_http_and_only_workers_reach_nixl(overlay):
    deployments = objects(overlay, "Deployment")
    ucx_low, ucx_high = (
        int(x) for x in container_env(overlay, deployments["prefill"])["UCX_TCP_PORT_RANGE"].split("-")
    )
    for dest in WORKERS:
        ports = named_ports(container(deployments[dest]))
        assert allowed(overlay, "proxy", dest, ports["http"])
        assert not allowed(overlay, "proxy", dest, ports["nixl"])
        assert not allowed(overlay, "proxy", dest, ucx_low)
        for source in WORKERS:
            assert allowed(overlay, source, dest, ports["nixl"]), f"{source} -> {dest} side channel"
            assert allowed(overlay, source, dest, ucx_low) and allowed(overlay, source, dest, ucx_high)
            assert not allowed(overlay, source, dest, ports["http"]), f"{source} -> {dest} http"
            assert not allowed(overlay, source, dest, ucx_high + 1)
    assert allowed(overlay, "prefill", "proxy", 8000)


def window_s(probe: dict) -> float:
    """How long a probe fails before Kubernetes acts on it."""
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_tell_the_same_restart_story_as_pdspec_up_and_compose(overlay):
    """Issue 19: a dead or hung worker is taken out of traffic by the proxy first (its own
    health checks), out of the Service's DNS next (readiness), and restarted last
    (liveness), so a short hang (the chaos soak's 10 s) is ridden out and a long one
    restarted; a crashed container is restarted by the kubelet, and the proxy readmits it
    after its health and pairing checks. A drain takes one worker of a role at a time."""
    from pdspec.settings import ProxySettings

    proxy = ProxySettings()
    proxy_eject_s = proxy.health.interval_s * proxy.health.eject_after_failures
    for role in WORKERS:
        deployment = objects(overlay, "Deployment")[role]
        c = container(deployment)
        readiness, liveness = window_s(c["readinessProbe"]), window_s(c["livenessProbe"])
        assert proxy_eject_s < readiness < liveness, (role, proxy_eject_s, readiness, liveness)
        assert liveness >= 60  # rides out a 10-s hang and a busy engine's slow /health
        assert c["livenessProbe"]["timeoutSeconds"] >= 5
        assert pod_spec(deployment).get("restartPolicy", "Always") == "Always"
        pdb = objects(overlay, "PodDisruptionBudget")[role]
        assert pdb["spec"] == {**pdb["spec"], "maxUnavailable": 1}
    proxy_deployment = objects(overlay, "Deployment")["proxy"]
    assert pod_spec(proxy_deployment).get("restartPolicy", "Always") == "Always"
    assert window_s(container(proxy_deployment)["livenessProbe"]) >= 30


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pdbs_and_pod_monitor_select_the_pods(overlay):
    for name, pdb in objects(overlay, "PodDisruptionBudget").items():
        assert deployments_selected(overlay, pdb["spec"]["selector"]) == {name}
    (monitor,) = objects(overlay, "PodMonitor").values()
    assert deployments_selected(overlay, monitor["spec"]["selector"]) == {"prefill", "decode", "proxy"}
    for deployment in objects(overlay, "Deployment").values():
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in named_ports(container(deployment))


def test_monitoring_copies_match_the_rules_and_dashboard():
    path = K8S / "components" / "monitoring" / "generate.py"
    spec = importlib.util.spec_from_file_location("k8s_monitoring_generate", path)
    generate = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = generate
    spec.loader.exec_module(generate)
    for name, make in generate.OUTPUTS.items():
        assert (path.parent / name).read_text() == make(), (
            f"deploy/k8s/components/monitoring/{name} is stale: run python {path.relative_to(ROOT)}"
        )
