"""The autoscaling components (deploy/k8s/components/autoscaling-keda and -hpa, rendered
through the overlays gpu-xpyd-keda and gpu-xpyd-hpa): each scaler targets a worker
Deployment that exists, reads only the pdspec-scaling recording rules
(deploy/prometheus/rules/recording.yml, checked by promtool in test_observability_config.py),
and every External metric of the HPAs has a prometheus-adapter rule that serves it from one
of them. The schemas are checked in test_k8s_manifests.py with the other overlays."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.deploy_wiring import ROOT
from tests.k8s_render import K8S, objects

RECORDING = ROOT / "deploy" / "prometheus" / "rules" / "recording.yml"
ADAPTER_RULES = K8S / "components" / "autoscaling-hpa" / "prometheus-adapter-rules.yaml"
RECORD_NAME = re.compile(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+")


def scaling_records() -> set[str]:
    (group,) = [g for g in yaml.safe_load(RECORDING.read_text())["groups"] if g["name"] == "pdspec-scaling"]
    return {rule["record"] for rule in group["rules"]}


def records_in(query: str) -> set[str]:
    return set(RECORD_NAME.findall(query))


def test_each_scaled_object_scales_a_worker_deployment_on_the_scaling_signals():
    scaled = objects("gpu-xpyd-keda", "ScaledObject")
    deployments = objects("gpu-xpyd-keda", "Deployment")
    assert set(scaled) == {"prefill", "decode"}
    for name, obj in scaled.items():
        assert obj["spec"]["scaleTargetRef"]["name"] == name and name in deployments
        assert 1 <= obj["spec"]["minReplicaCount"] < obj["spec"]["maxReplicaCount"]
        for trigger in obj["spec"]["triggers"]:
            assert trigger["type"] == "prometheus"
            query = trigger["metadata"]["query"]
            assert records_in(query) and records_in(query) <= scaling_records(), query
            assert float(trigger["metadata"]["threshold"]) > 0
            assert trigger["metadata"]["serverAddress"].startswith("http")
    # The decode workers are kept at least at the plan's ratio of the prefill workers, one way
    # only: a prefill floor read from the decode count would lock the pair (neither goes down).
    queries = {name: " ".join(t["metadata"]["query"] for t in obj["spec"]["triggers"]) for name, obj in scaled.items()}
    assert "pdspec:plan_decode_floor:replicas" in queries["decode"]
    assert "plan" not in queries["prefill"]


def test_each_hpa_metric_is_served_by_an_adapter_rule_on_a_scaling_signal():
    rules = yaml.safe_load(ADAPTER_RULES.read_text())["rules"]["external"]
    served = {rule["name"]["as"]: rule for rule in rules}
    for rule in rules:
        assert records_in(rule["seriesQuery"]) <= scaling_records() and records_in(rule["seriesQuery"])
        assert records_in(rule["metricsQuery"]) == records_in(rule["seriesQuery"])
    hpas = objects("gpu-xpyd-hpa", "HorizontalPodAutoscaler")
    assert set(hpas) == {"prefill", "decode"}
    used = set()
    for name, hpa in hpas.items():
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        for metric in hpa["spec"]["metrics"]:
            metric_name = metric["external"]["metric"]["name"]
            assert metric_name in served, metric_name
            used.add(metric_name)
    assert used == set(served)  # no rule serves a metric nothing reads


@pytest.mark.parametrize("overlay", ["gpu-xpyd-keda", "gpu-xpyd-hpa"])
def test_the_autoscaled_overlays_keep_the_deployment_they_scale(overlay):
    assert objects(overlay, "Deployment").keys() == objects("gpu-xpyd", "Deployment").keys()
    assert objects(overlay, "PrometheusRule")  # the signals' recording rules come with it
