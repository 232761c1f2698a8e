"""serve_bench's statistics, phase plan, worker-metric deltas, JSON and table.

The end-to-end run against real workers is tests/e2e/test_serve_bench.py; here a small
SSE server stands in for the endpoint, to check the client's timings and failures."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, StreamingResponse

from loadtest.serving import serve_bench

from loadtest.serving import serve_report

from loadtest.serving import worker_metrics
from loadtest.serving.serve_client import completion_body, random_prompts, run_load
from loadtest.serving.serve_stats import RequestResult, distribution_ms, meets_slos, parse_slos, summarize
from tests.standin import ThreadServer


def test_distribution_in_ms():
    d = distribution_ms([0.001 * i for i in range(1, 101)])  # 1..100 ms
    assert d["mean"] == pytest.approx(50.5)
    assert d["median"] == pytest.approx(50.5)
    assert d["p99"] == pytest.approx(99.01)
    assert distribution_ms([]) == {"mean": None, "median": None, "p99": None}


def test_tpot_excludes_first_token():
    r = RequestResult(True, 10, output_tokens=5, ttft_s=1.0, e2e_s=1.4)
    assert r.tpot_s == pytest.approx(0.1)
    assert RequestResult(True, 10, output_tokens=1, ttft_s=1.0, e2e_s=1.0).tpot_s is None


def test_summary_counts_only_completed_requests():
    ok = RequestResult(True, 100, 4, ttft_s=0.2, e2e_s=0.5, itl_s=[0.1, 0.1, 0.1])
    slow = RequestResult(True, 100, 4, ttft_s=2.0, e2e_s=2.3, itl_s=[0.1, 0.1, 0.1])
    failed = RequestResult(False, 100, error="HTTP 500: boom")
    s = summarize([ok, slow, failed], duration_s=2.0, slos={"ttft": 1000.0})
    assert (s["requests"], s["completed"], s["failed"]) == (3, 2, 1)
    assert s["output_tokens"] == 8 and s["output_tokens_per_s"] == pytest.approx(4.0)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(1100.0)
    assert s["itl_ms"]["median"] == pytest.approx(100.0)
    assert s["tpot_ms"]["median"] == pytest.approx(100.0)
    assert s["good_requests"] == 1 and s["goodput"] == pytest.approx(0.5)
    assert s["errors"] == ["HTTP 500: boom"]


def test_slos_parse_and_apply():
    assert parse_slos(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    for bad in (["ttft"], ["latency:5"], ["e2e:-1"]):
        with pytest.raises(ValueError):
            parse_slos(bad)
    r = RequestResult(True, 1, 3, ttft_s=0.4, e2e_s=0.6)  # TPOT 100 ms
    assert meets_slos(r, {"ttft": 500, "tpot": 100})
    assert not meets_slos(r, {"tpot": 99})
    assert not meets_slos(RequestResult(False), {})


def test_phase_plan_interleaves_abba():
    loads = [serve_bench.Load(32, None)]
    policies = [p for _, _, p in serve_bench.plan_phases(loads, 3, ab=True)]
    assert policies == ["auto", "always", "always", "auto", "auto", "always"]
    assert [p for _, _, p in serve_bench.plan_phases(loads, 2, ab=False)] == [None, None]
    two = serve_bench.plan_phases([serve_bench.Load(1, None), serve_bench.Load(4, None)], 1, ab=True)
    assert [(load.concurrency, p) for load, _, p in two] == [(1, "auto"), (1, "always"), (4, "auto"), (4, "always")]


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        serve_bench.parse_args(["--url", "http://x", "--concurrency", "0"])
    with pytest.raises(SystemExit):
        serve_bench.parse_args(["--url", "http://x", "--goodput", "speed:1"])
    args = serve_bench.parse_args(["--url", "http://x", "--request-rate", "2", "8", "--concurrency", "16"])
    assert [(lo.concurrency, lo.request_rate) for lo in serve_bench.loads_from(args)] == [(16, 2.0), (16, 8.0)]


def test_random_prompts_are_fresh_per_seed_and_in_vocabulary():
    a, b = random_prompts(4, 100, 4096, seed=1), random_prompts(4, 100, 4096, seed=2)
    assert len(a) == 4 and all(len(p) == 100 for p in a)
    assert a != b and a == random_prompts(4, 100, 4096, seed=1)
    assert all(10 <= t < 4096 for p in a for t in p)
    body = completion_body("m", a[0], 8)
    assert body["stream"] and body["ignore_eos"] and body["stream_options"] == {"include_usage": True}


METRICS_BEFORE = """# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 24.0
# TYPE pdspec_proposals_total counter
pdspec_proposals_total 10.0
# TYPE pdspec_k0_proposals_total counter
pdspec_k0_proposals_total 10.0
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 50.0
"""


def _after(prompt: int, proposals: int, k0: int, drafts: int, accepted: int) -> str:
    return (METRICS_BEFORE.replace("1000.0", f"{prompt}.0").replace("pdspec_proposals_total 10.0", f"pdspec_proposals_total {proposals}.0")
            .replace("pdspec_k0_proposals_total 10.0", f"pdspec_k0_proposals_total {k0}.0")
            .replace('model_name="m"} 100.0', f'model_name="m"}} {drafts}.0')
            .replace('model_name="m"} 50.0', f'model_name="m"}} {accepted}.0'))  # fmt: skip


def test_worker_figures_from_metric_deltas():
    before = worker_metrics.parse(METRICS_BEFORE)
    assert before[worker_metrics.PROMPT_TOKENS] == 1024.0  # summed over engines
    prefill = worker_metrics.deltas(before, worker_metrics.parse(_after(5000, 30, 26, 100, 50)))
    decode = worker_metrics.deltas(before, worker_metrics.parse(_after(1000, 10, 10, 140, 130)))
    figures = worker_metrics.worker_figures(prefill, decode, duration_s=2.0)
    assert figures["prefill_tokens_per_s"] == pytest.approx(2000.0)
    assert (figures["prefill_proposals"], figures["prefill_k0_proposals"]) == (20, 16)
    assert figures["decode_acceptance_length"] == pytest.approx(1 + 80 / 40)
    none = worker_metrics.worker_figures(None, decode, 1.0)
    assert none["prefill_proposals"] is None and none["decode_acceptance_length"] is not None
    assert worker_metrics.acceptance_length(worker_metrics.deltas(before, before)) is None


def _phase(index: int, policy: str | None, prefill_rate: float, k0: int, proposals: int) -> dict:
    results = [RequestResult(True, 64, 4, 0.1, 0.4, [0.1, 0.1, 0.1])]
    prefill = {worker_metrics.PROMPT_TOKENS: prefill_rate, worker_metrics.PROPOSALS: proposals,
               worker_metrics.K0_PROPOSALS: k0}  # fmt: skip
    return {"index": index, "repetition": index // 2, "policy": policy, "concurrency": 2, "request_rate": None,
            "load": "concurrency 2", **summarize(results, 1.0),
            **worker_metrics.worker_figures(prefill, None, 1.0)}  # fmt: skip


def test_ab_summary_table_and_files(tmp_path):
    phases = [_phase(0, "auto", 1100, 8, 8), _phase(1, "always", 1000, 0, 8),
              _phase(2, "always", 1000, 0, 8), _phase(3, "auto", 1050, 8, 8)]  # fmt: skip
    summary = serve_report.ab_summary(phases)
    assert len(summary) == 1
    row = summary[0]
    assert row["auto_prefill_tokens_per_s"] == pytest.approx(1075)
    assert row["auto_vs_always_pct"] == pytest.approx(7.5)
    assert row["pair_ratios"] == pytest.approx([1.1, 1.05])
    assert row["k0_proposals"] == {"auto": 16, "always": 0} and row["proposals"] == {"auto": 16, "always": 16}
    report = {"label": "cpu", "command": "python -m loadtest.serve_bench --ab", "url": "http://p", "model": "m",
              "num_prompts": 1, "input_len": 64, "output_len": 4, "ab": True, "phases": phases,
              "ab_summary": summary}  # fmt: skip
    table = serve_report.markdown(report)
    assert "| concurrency 2 | 1,000 | 1,075 | +7.5% | 1.050..1.100 | 16 / 16 | 0 / 16 |" in table
    assert table.count("| concurrency 2 | auto |") == 2 and table.count("| concurrency 2 | always |") == 2
    written = serve_report.write(report, tmp_path)
    names = {p.name for p in written}
    assert {"serve_bench.json", "serve_bench.md", "serve_bench_latency.png", "serve_bench_ab.png"} <= names
    data = json.loads((tmp_path / "serve_bench.json").read_text())
    for field in ("policy", "requests", "failed", "ttft_ms", "itl_ms", "output_tokens_per_s", "prefill_tokens_per_s",
                  "prefill_proposals", "prefill_k0_proposals", "decode_acceptance_length"):  # fmt: skip
        assert field in data["phases"][0]
    assert set(data["phases"][0]["ttft_ms"]) == {"mean", "median", "p99"}


def test_ab_plot_of_a_run_whose_deadline_left_no_phase(tmp_path):
    serve_report.plot_ab({"label": "late", "phases": [], "ab_summary": []}, tmp_path / "ab.png")
    assert (tmp_path / "ab.png").read_bytes().startswith(b"\x89PNG")


def _sse_app(gap_s: float, tokens: int, fail_every: int = 0) -> FastAPI:
    app = FastAPI()
    seen = []

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        seen.append(body)
        if fail_every and len(seen) % fail_every == 0:
            return JSONResponse({"error": {"message": "busy"}}, status_code=503)

        async def events():
            for i in range(tokens):
                await asyncio.sleep(gap_s)
                yield f"data: {json.dumps({'choices': [{'text': f't{i}'}]})}\n\n".encode()
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": tokens}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app.state.seen = seen
    return app


def test_client_times_a_stream_and_counts_failures():
    app = _sse_app(gap_s=0.05, tokens=4, fail_every=3)
    with ThreadServer(app) as server:
        bodies = [completion_body("m", p, 4) for p in random_prompts(6, 32, 4096, seed=0)]
        results, duration = asyncio.run(run_load(server.url, bodies, concurrency=2, request_rate=None))
    ok = [r for r in results if r.ok]
    assert len(ok) == 4 and sum(not r.ok for r in results) == 2
    assert all("HTTP 503" in r.error for r in results if not r.ok)
    for r in ok:
        assert r.output_tokens == 4 and r.prompt_tokens == 32 and len(r.itl_s) == 3
        assert 0.04 < r.ttft_s < 1.0 and all(0.03 < g < 1.0 for g in r.itl_s)
    # Two in flight at a time: four streams of ~0.2 s take at least ~0.4 s.
    assert duration > 0.35
    assert all(b["prompt"] and isinstance(b["prompt"][0], int) for b in app.state.seen)
