"""The shipped Prometheus configuration, rules and Grafana dashboard, checked without a
running stack: promtool (Debian's prometheus package, installed by `make test`) and the
dashboard's structure. tests/e2e/test_observability.py evaluates every expression on a
real Prometheus scraping real workers."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess

import pytest
import yaml

from deploy.prometheus.promql import (
    DASHBOARD,
    REPO,
    RULES_DIR,
    load_dashboard,
    metric_names,
    panel_queries,
    rule_queries,
    substitute,
)
from tests.prometheus_server import binary, fast_rules

PROM_DIR = REPO / "deploy" / "prometheus"
ROWS = ("K=0 proposals", "Speculative decoding", "P/D hand-off", "Latency and load")
ALERTS = {
    "PdspecPrefillDraftingWithAutoPolicy",
    "PdspecDecodeOnlyFallback",
    "PdspecNixlTransferFailures",
    "PdspecPrefillKvExpired",
    "PdspecPrefillKvOnlyPassOff",
    "PdspecDecodeAcceptanceDrop",
    "PdspecTargetDown",
    "PdspecNoHealthyWorker",
    "PdspecProxyErrors",
    "PdspecProxyInternalError",
    "PdspecPDConfigMismatch",
    "PdspecPrefillDraftsAlways",
}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def configs() -> list:
    # The local stack's and, when the compose deployment ships one, compose's.
    return [p for p in (PROM_DIR / "prometheus.yml", REPO / "deploy" / "compose" / "prometheus.yml") if p.exists()]


@pytest.mark.parametrize("config", configs(), ids=lambda p: str(p.relative_to(REPO)))
def test_promtool_check_config(config):
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_rules():
    files = sorted(RULES_DIR.glob("*.yml"))
    assert [f.name for f in files] == ["alerts.yml", "recording.yml"]
    result = promtool("check", "rules", *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("rule_tests", ["alerts_test.yml", "scaling_test.yml"])
def test_promtool_test_rules(rule_tests):
    result = promtool("test", "rules", str(PROM_DIR / "tests" / rule_tests))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_scaling_signal_is_unit_tested():
    """The pdspec-scaling group's records (what the autoscaling components query), each
    checked by scaling_test.yml."""
    groups = yaml.safe_load((RULES_DIR / "recording.yml").read_text())["groups"]
    (scaling,) = [group for group in groups if group["name"] == "pdspec-scaling"]
    tested = yaml.safe_load((PROM_DIR / "tests" / "scaling_test.yml").read_text())
    checked = {case["expr"] for test in tested["tests"] for case in test["promql_expr_test"]}
    assert {rule["record"] for rule in scaling["rules"]} == checked


def test_every_alert_is_unit_tested_and_has_a_runbook():
    alerts = {q.name for q in rule_queries() if q.source == "alert"}
    assert alerts == ALERTS
    tested = yaml.safe_load((PROM_DIR / "tests" / "alerts_test.yml").read_text())
    fired = {t["alertname"] for case in tested["tests"] for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    assert fired == ALERTS
    for group in yaml.safe_load((RULES_DIR / "alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
            assert len(rule["annotations"]["runbook"]) > 40, rule["alert"]
            assert "summary" in rule["annotations"], rule["alert"]


def test_the_test_prometheus_rules_fire_at_once(tmp_path):
    fast_rules(RULES_DIR, tmp_path)
    for path in tmp_path.glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            assert all(rule.get("for", "0s") == "0s" for rule in group["rules"])
    assert promtool("check", "rules", *map(str, sorted(tmp_path.glob("*.yml")))).returncode == 0


# --- the dashboard -------------------------------------------------------------------


def test_dashboard_json_is_what_its_generator_writes():
    spec = importlib.util.spec_from_file_location("dashboard", REPO / "deploy" / "grafana" / "dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert DASHBOARD.read_text() == module.render(), "run `python deploy/grafana/dashboard.py`"


def test_dashboard_structure():
    d = load_dashboard()
    assert d["schemaVersion"] >= 39 and d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("role", "instance"):
        assert variables[name]["type"] == "query" and variables[name]["includeAll"] and variables[name]["multi"]
        assert "pdspec_worker_info" in variables[name]["definition"]
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert [any(r.startswith(prefix) for r in rows) for prefix in ROWS] == [True] * len(ROWS)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for panel in d["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["type"] in ("timeseries", "stat", "table") and panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip()
    # Panels do not overlap.
    cells = set()
    for panel in d["panels"]:
        pos = panel["gridPos"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


def test_per_worker_panels_split_by_role_and_honour_the_variables():
    for q in panel_queries(load_dashboard()):
        names = metric_names(q.expr)
        worker_metric = any(n.startswith(("vllm:", "pdspec_proposals", "pdspec_k0", "pdspec_draft")) for n in names)
        if worker_metric:
            assert 'pdspec_worker_info{role=~"$role", instance=~"$instance"}' in q.expr, q.name
            assert "{{role}}" in q.legend, q.name


def test_expressions_name_only_known_metrics():
    """Every metric in the dashboard and rules is one pdspec, the proxy, vLLM 0.32 or
    Prometheus exports (or a recording rule); tests/e2e/test_observability.py then finds
    each of them on a real stack."""
    recorded = {q.name for q in rule_queries() if q.source == "record"}
    queries = panel_queries(load_dashboard()) + rule_queries()
    seen = set()
    for q in queries:
        for name in metric_names(substitute(q.expr)):
            seen.add(name)
            assert name in recorded or name == "up" or re.match(r"(pdspec_|vllm:)", name), (q.name, name)
    assert {
        "pdspec_worker_info",
        "pdspec_k0_proposals_total",
        "vllm:nixl_bytes_transferred_sum",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "pdspec_proxy_leg_seconds_bucket",
    } <= seen


def test_metric_names_of_an_expression():
    expr = (
        'sum by (instance) (rate(vllm:spec_decode_num_drafts_total{job="x"}[5m])) * on (instance) '
        'group_left (role) max by (instance, role) (pdspec_worker_info{role=~"$role"}) > 0 or up == 0'
    )
    assert metric_names(expr) == {"vllm:spec_decode_num_drafts_total", "pdspec_worker_info", "up"}
    assert json.loads(json.dumps(substitute('a{role=~"$role"}[$__rate_interval]'))) == 'a{role=~".*"}[1m]'
