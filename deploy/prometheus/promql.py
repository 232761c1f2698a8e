"""The PromQL pdspec ships (Grafana dashboard, recording and alert rules) and a small
client for Prometheus's HTTP API, shared by the dashboard snapshot and the tests."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "pdspec-dashboard.json"
RULES_DIR = REPO / "deploy" / "prometheus" / "rules"


@dataclass(frozen=True)
class Query:
    """One PromQL expression and where it comes from (a panel's target or a rule)."""

    source: str  # "panel" | "record" | "alert"
    name: str  # panel title (with refId) or rule name
    expr: str
    legend: str = ""
    panel_type: str = ""
    unit: str = ""
    row: str = ""  # the dashboard row a panel sits in


def load_dashboard(path: Path = DASHBOARD) -> dict:
    return json.loads(path.read_text())


def panel_queries(dashboard: dict) -> list[Query]:
    queries = []
    row = ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        for target in panel.get("targets", []):
            queries.append(
                Query(
                    "panel",
                    f"{panel['title']} [{target['refId']}]",
                    target["expr"],
                    target.get("legendFormat", ""),
                    panel["type"],
                    panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""),
                    row,
                )
            )
    return queries


def rule_queries(rules_dir: Path = RULES_DIR) -> list[Query]:
    import yaml  # only here: the snapshot needs no YAML

    queries = []
    for path in sorted(rules_dir.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                kind = "alert" if "alert" in rule else "record"
                queries.append(Query(kind, rule[kind], rule["expr"].strip()))
    return queries


def substitute(expr: str, rate_interval: str = "1m", time_range: str = "1h", variables: dict | None = None) -> str:
    """What Grafana sends for an expression: its built-in intervals and the dashboard's
    variables (all of them set to "All", i.e. `.*`, unless given)."""
    values = {"role": ".*", "instance": ".*", **(variables or {})}
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__range", time_range)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), expr)


# Words in PromQL that are not metric names (functions, aggregations, keywords).
_NOT_METRICS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "group",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "histogram_quantile",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "last_over_time",
    "sum_over_time",
    "count_over_time",
    "label_replace",
    "label_join",
    "vector",
    "scalar",
    "absent",
    "absent_over_time",
    "clamp_min",
    "clamp_max",
    "abs",
    "time",
    "le",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (label matchers and grouping labels left out)."""
    # Drop label matchers {...}, grouping clauses (...) after by/on/..., strings and ranges.
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:$.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", text):
        word = match.group(1)
        if word.lower() not in _NOT_METRICS and not re.fullmatch(r"\d+\w*", word):
            names.add(word)
    return names


class PromQLError(RuntimeError):
    pass


class Prometheus:
    """Prometheus's HTTP API: instant and range queries, alerts, targets."""

    def __init__(self, url: str, timeout_s: float = 30) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(timeout=timeout_s)

    def _get(self, path: str, **params) -> dict:
        response = self.http.get(self.url + path, params=params)
        body = response.json()
        if body.get("status") != "success":
            raise PromQLError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = at
        return self._get("/api/v1/query", **params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self._get("/api/v1/query_range", query=expr, start=start, end=end, step=step)["result"]

    def alerts(self) -> list[dict]:
        return self._get("/api/v1/alerts")["alerts"]

    def firing(self) -> dict[str, list[dict]]:
        """Alert name -> labels of each of its firing instances."""
        out: dict[str, list[dict]] = {}
        for alert in self.alerts():
            if alert["state"] == "firing":
                out.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return out

    def targets(self) -> list[dict]:
        return self._get("/api/v1/targets")["activeTargets"]

    def close(self) -> None:
        self.http.close()
