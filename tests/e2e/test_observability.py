"""The dashboard and the rules on a real Prometheus (Debian's binary, started here on a
free loopback port) scraping the shared `pdspec up` stack: after traffic, every PromQL
expression of the dashboard and of the rules parses and returns data, except those that
can only be non-empty under a fault; then faults are provoked and their alerts must fire
in /api/v1/alerts.

The test Prometheus scrapes and evaluates every second, and its copy of the rules has
`for: 0s` (tests/prometheus_server.py); the shipped durations are covered by
`promtool test rules` (tests/unit/deploy/test_observability_config.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.prometheus.promql import load_dashboard, metric_names, panel_queries, rule_queries, substitute
from tests import harness
from tests.prometheus_server import PrometheusServer
from tests.prompts import ACCEPTANCE_PROMPTS, acceptance_body, chat_body, completion_body, unique_prompt
from tests.standin import unused_port

# Windows for Grafana's built-in intervals: the traffic below is within them.
RATE_INTERVAL, TIME_RANGE = "2m", "10m"

# Panels that read series which exist only after something went wrong. Each is provoked
# in test_faults_fire_their_alerts (leg failures) or in tests/e2e/test_faults.py (KV
# releases: a client gone between the legs; the counter is asserted there).
FAULT_ONLY_PANELS = {
    "Proxy leg failures per second [A]",  # provoked below: a prompt the prefill worker refuses
    "KV releases (client gone between the legs) [A]",  # tests/e2e/test_faults.py
    "KV read once: re-prefills and stale KV recomputed [A]",  # tests/unit/proxy/flow/test_disagg_leaving.py
    # Only a proxy with admission.prefill_kv exports these: tests/e2e/test_prefill_admission.py
    # queries them on a real Prometheus scraping one.
    "Prefill KV room (admission) [A]",
    "Prefill KV room (admission) [B]",
    "Prefill queue (admission) [A]",
}
FAULT_ONLY_METRICS = {
    "pdspec_proxy_leg_failures_total",
    "pdspec_proxy_kv_releases_total",
    "pdspec_proxy_kv_reprefills_total",
    "pdspec_proxy_prefill_kv_free_tokens",
    "pdspec_proxy_kv_room_waits_total",
    "pdspec_proxy_prefill_queued_seconds",
}
# The cache-aware routing row reads what only a proxy with kv_aware routing exports (the
# shared stack routes by prefix affinity, prefix caching off): tests/e2e/test_kv_routing.py
# runs that row on a real Prometheus scraping a 2P1D fleet that routes kv_aware.
KV_ROUTING_ROW = "Cache-aware routing"
KV_ROUTING_METRICS = {
    "pdspec_proxy_predicted_hit_tokens_total",
    "pdspec_proxy_routing_decisions_total",
    "pdspec_proxy_kv_index_blocks",
    "pdspec_proxy_kv_event_lag_seconds",
    "pdspec_proxy_kv_events_total",
}
# The plan's records read what only a proxy given a plan exports (observability.plan_replicas):
# tests/e2e/test_scaling_signals.py queries them on a real Prometheus scraping one.
PLAN_RECORDS = {
    "pdspec:plan_decode_per_prefill:ratio",
    "pdspec:plan_decode_floor:replicas",
}
PLAN_METRICS = {"pdspec_plan_replicas"}
# Alerts provoked below (the rest: promtool test rules, see the README's alert table):
# NIXL transfer failures (would need a broken NIXL link), the acceptance drop (needs an
# hour of history), a P/D config mismatch (NIXL refuses such a pair at its handshake).


@pytest.fixture
def prometheus(stack, tmp_path_factory):
    # One fresh Prometheus per test: the fault test runs last (stops_stack), after other
    # modules' tests sent requests straight to the prefill worker (K>0 under auto, a
    # real alert); a server scraping since the first test would still hold those rates.
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), unused_port(18950, 18969))
    server.start_scraping(stack.proxy_url, [stack.prefill_url], [stack.decode_url])
    yield server
    server.stop()


def send_traffic(stack, client) -> int:
    """Long prompts (several prefill chunks: K=0 steps) and short ones, whole and streamed;
    and two held-out code prompts that the trained drafter is accepted on, so the acceptance
    panel reads more than the random continuations of the unique prompts (seen at 1.43)."""
    bodies = [
        acceptance_body(ACCEPTANCE_PROMPTS[0]),
        acceptance_body(ACCEPTANCE_PROMPTS[1]),
        completion_body(unique_prompt(400), max_tokens=32),
        completion_body(unique_prompt(60), max_tokens=48),
        completion_body(unique_prompt(200), stream=True, max_tokens=32),
        chat_body([{"role": "user", "content": unique_prompt(80)}], max_tokens=32),
        completion_body(unique_prompt(150), max_tokens=64, ignore_eos=True),
    ]
    for body in bodies:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        with client.stream("POST", stack.proxy_url + path, json=body) as response:
            assert response.status_code == 200
            response.read()
    return len(bodies)


def values(result: list[dict]) -> dict[str, float]:
    return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in result}


def by_label(result: list[dict], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def test_every_dashboard_and_rule_expression_returns_data(stack, client, prometheus, tmp_path):
    api = prometheus.api
    before = sum(values(api.query("sum(pdspec_proxy_requests_total)")).values() or [0])
    sent = send_traffic(stack, client)
    # Scraped after the traffic, and the recording rules evaluated on it.
    prometheus.wait_for(
        "sum(pdspec_proxy_requests_total)",
        lambda r: r and float(r[0]["value"][1]) >= before + sent,
        what="the traffic scraped",
    )
    prometheus.wait_for("instance:vllm_spec_decode_acceptance_length:rate5m", bool, what="recording rules")

    # Each worker tells its role: the dashboard's variables and joins need it.
    roles = by_label(api.query("instance:pdspec_worker_info:role"), "role")
    assert set(roles) == {"prefill", "decode"}, "pdspec_worker_info missing or without role"

    empty, alerts_now = [], []
    for q in panel_queries(load_dashboard()) + rule_queries():
        result = api.query(substitute(q.expr, RATE_INTERVAL, TIME_RANGE))  # raises unless it parses
        if q.source == "alert":
            if result:
                alerts_now.append((q.name, result))
        elif not result and q.name not in FAULT_ONLY_PANELS | PLAN_RECORDS and q.row != KV_ROUTING_ROW:
            empty.append(q.name)
    assert not empty, f"expressions with no data after traffic: {empty}"
    assert not alerts_now, f"alerts true on a healthy stack: {alerts_now}"

    # Every metric named anywhere is exported by somebody (a panel on a metric nobody
    # exports fails here), except the two that exist only after a fault.
    recorded = {q.name for q in rule_queries() if q.source == "record"}
    names = set()
    for q in panel_queries(load_dashboard()) + rule_queries():
        names |= metric_names(substitute(q.expr)) - recorded
    missing = [
        n
        for n in sorted(names - FAULT_ONLY_METRICS - KV_ROUTING_METRICS - PLAN_METRICS)
        if not api.query(f'count({{__name__="{n}"}})')
    ]
    assert not missing, f"metrics nobody exports: {missing}"

    # What the panels show is right: the prefill worker proposed with K=0 in every step,
    # the decode worker drafted and had drafts accepted, KV came over NIXL.
    window = f"[{TIME_RANGE}]"
    share = by_label(
        api.query(
            substitute(
                "(sum by (instance) (increase(pdspec_k0_proposals_total[$__range])) / "
                "(sum by (instance) (increase(pdspec_proposals_total[$__range])) > 0)) "
                "* on (instance) group_left (role) instance:pdspec_worker_info:role",
                RATE_INTERVAL,
                TIME_RANGE,
            )
        ),
        "role",
    )
    assert share["prefill"] == pytest.approx(1.0)
    assert share["decode"] < 0.5
    length = by_label(api.query("instance:vllm_spec_decode_acceptance_length:rate5m"), "instance")
    assert length[stack.decode_url.removeprefix("http://")] > 1.5
    nixl = by_label(api.query(f"sum by (instance) (increase(vllm:nixl_bytes_transferred_sum{window}))"), "instance")
    assert nixl[stack.decode_url.removeprefix("http://")] > 0
    assert nixl[stack.prefill_url.removeprefix("http://")] == 0  # decode pulls; prefill is read from

    # The picture: the dashboard's own time-series panels over the last minutes.
    out = snapshot(prometheus, Path(os.environ.get("PDSPEC_SNAPSHOT_OUT", tmp_path)) / "healthy")
    png = (out / "dashboard.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 50_000
    drawn = {p["title"]: p["series"] for p in json.loads((out / "dashboard.json").read_text())["panels"]}
    for title in (
        "Drafter steps per second: all and K=0",
        "Mean acceptance length",
        "NIXL bytes pulled per second",
        "Proxy hand-off time p50 / p99",
        "Client requests by status",
        "KV cache usage",
    ):
        assert drawn[title], f"snapshot panel without data: {title}"


def snapshot(prometheus, out: Path, minutes: float = 3) -> Path:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.grafana.snapshot",
            "--prometheus",
            prometheus.url,
            "--out",
            str(out),
            "--minutes",
            str(minutes),
            "--scrape-interval",
            "1",
        ],
        cwd=harness.REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def wait_for_alerts(prometheus, expected: dict[str, list[dict]], timeout_s: float, keep_busy) -> dict:
    """Polls /api/v1/alerts until each expected alert fires with (at least) the given
    labels; `keep_busy` runs between polls (engines reap expired KV on their steps)."""
    deadline = time.monotonic() + timeout_s
    firing: dict = {}
    while time.monotonic() < deadline:
        firing = prometheus.api.firing()
        if all(
            any(all(f.get(k) == v for k, v in want.items()) for f in firing.get(name, []))
            for name, wants in expected.items()
            for want in wants
        ):
            return firing
        keep_busy()
        time.sleep(1)  # poll interval
    raise AssertionError(f"alerts not firing in {timeout_s:.0f}s: expected {expected}, firing {firing}")


# Ordered with the tests that stop the shared stack, after every test reading its
# counters: drafting on the prefill worker and expired KV are what they check is absent.
@pytest.mark.stops_stack
def test_faults_fire_their_alerts(stack, client, prometheus, tmp_path):
    watched = {
        "PdspecPrefillDraftingWithAutoPolicy",
        "PdspecDecodeOnlyFallback",
        "PdspecNoHealthyWorker",
        "PdspecProxyErrors",
        "PdspecTargetDown",
        "PdspecPrefillKvExpired",
        "PdspecPrefillDraftsAlways",
        "PdspecPrefillKvOnlyPassOff",
        "PdspecProxyInternalError",
    }
    assert not watched & set(prometheus.api.firing()), prometheus.api.firing()

    host = lambda url: url.removeprefix("http://")  # noqa: E731
    gone_prefill, gone_decode = (
        f"http://127.0.0.1:{unused_port(18971, 18979)}",
        f"http://127.0.0.1:{unused_port(18981, 18989)}",
    )
    common = {"health": {"interval_s": 0.5}, "worker_client": {"prefill_timeout_s": 30, "decode_timeout_s": 60}}
    # A: its only prefill worker is gone and its policy is fallback: decode-only on the
    # real decode worker.
    fallback = harness.start_proxy(
        unused_port(18991, 18994),
        prefill_urls=[gone_prefill],
        decode_urls=[stack.decode_url],
        **common,
        retries={"prefill_failure_policy": "fallback"},
    )
    # B: its only decode worker is gone: the real prefill worker prefills, nobody reads
    # the KV (it expires after its lease), and the client gets a 5xx.
    no_decode = harness.start_proxy(
        unused_port(18996, 18998),
        prefill_urls=[stack.prefill_url],
        decode_urls=[gone_decode],
        **common,
        retries={"prefill_failure_policy": "error"},
    )
    try:
        for proxy in (fallback, no_decode):
            harness.wait_healthy(proxy.url, proxy.process)
        prometheus.set_targets("pdspec-proxy", [host(stack.proxy_url), host(fallback.url), host(no_decode.url)])
        prometheus.set_targets("pdspec-decode", [host(stack.decode_url), host(gone_decode)])
        # Traffic only once both new proxies were scraped: a counter's first sample is where
        # its rate starts, so fallbacks made before it would never show as a rate.
        new_proxies = f'up{{job="pdspec-proxy", instance=~"{host(fallback.url)}|{host(no_decode.url)}"}}'
        prometheus.wait_for(
            new_proxies,
            lambda r: len(r) == 2 and all(x["value"][1] == "1" for x in r),
            what="the new proxies' first scrape",
        )
        # The prefill worker asked to generate (a client bypassing the proxy): it drafts with K>0.
        for _ in range(2):
            body = completion_body(unique_prompt(40), max_tokens=32, ignore_eos=True)
            assert client.post(stack.prefill_url + "/v1/completions", json=body).status_code == 200
        # Prompts beyond the model's context: the prefill worker refuses them (failed legs).
        # Two, one scrape apart: a counter's first sample is where its rate starts from.
        for _ in range(2):
            too_long = client.post(stack.proxy_url + "/v1/completions", json=completion_body(unique_prompt(2500)))
            assert too_long.status_code == 400
            prometheus.wait_for('pdspec_proxy_leg_failures_total{leg="prefill"}', bool, what="a failed leg scraped")
        # Three of each, every one scraped before the next: each adds to a rate.
        fallbacks = f'pdspec_proxy_prefill_outcomes_total{{instance="{host(fallback.url)}", outcome="fallback"}}'
        errors = f'sum(pdspec_proxy_requests_total{{instance="{host(no_decode.url)}", status=~"5.."}})'
        for sent in range(1, 4):
            reply = client.post(fallback.url + "/v1/completions", json=completion_body(unique_prompt(40)))
            assert reply.status_code == 200  # decode-only
            reply = client.post(no_decode.url + "/v1/completions", json=completion_body(unique_prompt(40)))
            assert reply.status_code >= 500
            for expr in (fallbacks, errors):
                prometheus.wait_for(expr, lambda r, n=sent: bool(r) and float(r[0]["value"][1]) == n, what=expr)

        def keep_busy():
            client.post(stack.proxy_url + "/v1/completions", json=completion_body(unique_prompt(20), max_tokens=2))

        fallback_at, no_decode_at, prefill_at = host(fallback.url), host(no_decode.url), host(stack.prefill_url)
        wait_for_alerts(
            prometheus,
            {
                "PdspecPrefillDraftingWithAutoPolicy": [{"instance": prefill_at, "role": "prefill"}],
                "PdspecDecodeOnlyFallback": [{"instance": fallback_at}],
                "PdspecNoHealthyWorker": [{"instance": no_decode_at, "pool": "decode"}],
                "PdspecProxyErrors": [{"instance": no_decode_at}],
                "PdspecTargetDown": [{"instance": host(gone_decode), "job": "pdspec-decode"}],
                # The shared stack's KV lease is 30 s (harness.TEST_STACK_ARGS).
                "PdspecPrefillKvExpired": [{"instance": prefill_at}],
            },
            timeout_s=150,
            keep_busy=keep_busy,
        )
        firing = prometheus.api.firing()
        # Switched to `always` on purpose: the info alert, not the `auto` one.
        set_prefill_policy(stack, "always")
        wait_for_alerts(
            prometheus, {"PdspecPrefillDraftsAlways": [{"instance": prefill_at}]}, timeout_s=30, keep_busy=lambda: None
        )
        # Nothing fired for what is healthy.
        assert {a["instance"] for a in firing["PdspecProxyErrors"]} == {no_decode_at}
        assert {a["instance"] for a in firing["PdspecDecodeOnlyFallback"]} == {fallback_at}
        # The fault-only panel provoked here now has data.
        panel = next(q for q in panel_queries(load_dashboard()) if q.name == "Proxy leg failures per second [A]")
        legs = prometheus.api.query(substitute(panel.expr, "5m", TIME_RANGE))  # as zoomed out to hours
        assert "prefill" in {r["metric"]["leg"] for r in legs if float(r["value"][1]) > 0}, legs
        # The picture with the faults in it: the fallback share and failed legs show.
        out = snapshot(prometheus, Path(os.environ.get("PDSPEC_SNAPSHOT_OUT", tmp_path)) / "faults", minutes=5)
        drawn = {p["title"]: p["series"] for p in json.loads((out / "dashboard.json").read_text())["panels"]}
        assert max(max(s["v"]) for s in drawn["Decode-only fallback share (5m, recorded)"]) > 0
    finally:
        set_prefill_policy(stack, "auto")
        for proxy in (fallback, no_decode):
            proxy.stop()


def set_prefill_policy(stack, policy: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pdspec.cli",
            "drafts",
            "--role",
            "prefill",
            "--policy",
            policy,
            "--run_dir",
            str(stack.run_dir),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
