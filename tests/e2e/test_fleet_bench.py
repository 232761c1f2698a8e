"""The fleet benchmark end to end at CI size: one prefill and one decode worker of the
shipped model (the fewest that disaggregate), a few requests per trace, every pdspec
policy (vLLM's router too where `vllm_router` is importable). Asserts the result's fields
and that every policy served every request; its speed figures are not asserted (two CPU
cores shared by both engines say nothing about them).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from loadtest.serving import fleet_bench, fleet_report
from loadtest.serving.fleet_trace import multi_turn, shared_context, write_trace
from tests import harness

pytestmark = pytest.mark.e2e

BASE_PORT = 28000  # apart from every other test's ports (tests/harness.py, tests/e2e/*)
PDSPEC_POLICIES = list(fleet_bench.POLICIES)


def test_every_policy_serves_every_request_and_the_report_has_its_fields(tmp_path, monkeypatch):
    sc = shared_context(
        1,
        tenants=3,
        context=256,
        question=16,
        max_tokens=4,
        levels=[(4.0, 1.5)],
        warmup_requests=2,
        warmup_qps=8.0,
        vocab=4000,
    )
    mt = multi_turn(
        2,
        turns=2,
        start=128,
        answer=16,
        message=16,
        max_tokens=4,
        think_s=0.0,
        levels=[(4.0, 1.0)],
        warmup_sessions=0,
        vocab=4000,
    )
    traces = {"sc": sc, "mt": mt}
    for name, trace in traces.items():
        trace.name = name
        write_trace(trace, tmp_path / f"{name}.json.gz")
    policies = PDSPEC_POLICIES + ([fleet_bench.VLLM_ROUTER] if importlib.util.find_spec("vllm_router") else [])
    jobs = [f"sc:{p}" for p in policies] + ["mt:kv_aware_conditional"]
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # /reset_prefix_cache between jobs
    out = tmp_path / "out"
    argv = [
        "--out",
        str(out),
        "--run-dir",
        str(tmp_path / "run"),
        "--trace",
        str(tmp_path / "sc.json.gz"),
        "--trace",
        str(tmp_path / "mt.json.gz"),
        "--jobs",
        ",".join(jobs),
        "--prefill-replicas",
        "1",
        "--decode-replicas",
        "1",
        "--base-port",
        str(BASE_PORT),
        "--prefill-port",
        str(BASE_PORT + 100),
        "--decode-port",
        str(BASE_PORT + 200),
        "--side-channel-port",
        str(BASE_PORT + 600),
        "--kv-events-port",
        str(BASE_PORT + 650),
        "--kv-blocks",
        "66",
        "--block-size",
        "32",
        "--drain-s",
        "60",
        "--up-args",
        f"--model.models_dir {harness.models_dir()} --restart never",
    ]
    if fleet_bench.VLLM_ROUTER in policies:
        argv += ["--vllm-router", "python -m vllm_router.launch_router"]
    report = fleet_bench.main(argv)

    assert report["skipped"] == [] and report["fleet_ready_s"] > 0
    assert [(j["workload"], j["policy"]) for j in report["jobs"]] == [tuple(j.split(":")) for j in jobs]
    for job in report["jobs"]:
        assert job["reset"]["refused"] == [], job["reset"]
        assert job["reset"]["index_cleared"] is (True if job["policy"] in fleet_bench.INDEXED else None), job["reset"]
        rows = [json.loads(line) for line in (out / f"requests-{job['workload']}-{job['policy']}.jsonl").open()]
        trace = traces[job["workload"]]
        assert sorted(r["id"] for r in rows) == [r.id for r in trace.requests]
        failed = [r for r in rows if not r["ok"]]
        assert failed == [], f"{job['policy']}: {failed[:2]}"
        assert all(r["output_tokens"] == 4 and r["ttft_s"] > 0 for r in rows)
        level = job["levels"][0]
        assert level["requests"] == len(trace.phase("level-0")) and set(level["workers"]) == {
            *report["workers"]["prefill"],
            *report["workers"]["decode"],
        }
    # Every request's prompt tokens were counted by some worker: vLLM's by-source counters moved.
    kv = next(j for j in report["jobs"] if j["policy"] == "kv_aware")
    computed = sum(w.get("source:local_compute", 0.0) for w in kv["levels"][0]["workers"].values())
    assert computed > 0

    built = fleet_report.main(
        [str(out), "--trace", f"sc={tmp_path / 'sc.json.gz'}", "--trace", f"mt={tmp_path / 'mt.json.gz'}"]
    )
    summaries = {(s["workload"], s["policy"]): s for s in built["summaries"]}
    assert set(summaries) == {tuple(j.split(":")) for j in jobs}
    for summary in summaries.values():
        (level,) = summary["levels"]
        assert level["ok"] == level["requests"] and level["failed"] == 0
        for field in ("p50", "p90", "p99"):
            assert level["ttft_ms"][field] > 0
        assert level["tpot_ms"]["p90"] > 0 and 0 <= level["fleet_hit_rate"] <= 1
        assert set(level["slo"]) == set(fleet_report.SLOS) and set(summary["goodput"]) == set(fleet_report.SLOS)
        assert level["acceptance_length"] is None or level["acceptance_length"] >= 1
        if summary["policy"] != fleet_bench.VLLM_ROUTER:  # pdspec's proxies say what routing cost
            assert level["route_ms"]["p50"] >= 0
    colocated = summaries[("sc", "colocated_kv_aware")]["levels"][0]
    assert colocated["local_prefills"] == colocated["requests"]  # every prompt prefilled where it was decoded
    assert summaries[("sc", "kv_aware")]["levels"][0]["local_prefills"] == 0
    # No decode worker's KV fills at this size: nothing served whole on a prefill worker.
    assert all(s["levels"][0]["whole_on_prefill"] == 0 for s in summaries.values())
    ref = built["reference"]["sc"]
    assert set(ref["by_workers"]) == {"1", "2"} and 0 <= ref["by_workers"]["2"]["eagle"]["achievable"] <= 1
    assert {g["goal"] for g in built["goals"]["sc"]} >= {"kv_aware goodput >= 1.25x round_robin's"}
    for name in ("fleet_report.json", "README-tables.md", "ttft_p90_vs_qps.png", "goodput.png"):
        assert (out / name).stat().st_size > 0
    assert os.environ["VLLM_SERVER_DEV_MODE"] == "1"
