"""serve_bench's statistics, phase plan, worker-metric deltas, JSON and table.

The end-to-end run against real workers is tests/e2e/test_serve_bench.py; here a small
SSE server stands in for the endpoint, to check the client's timings and failures."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from loadtest.serving import serve_bench, serve_report, worker_metrics
from loadtest.serving.queue_sampler import QueueSample
from loadtest.serving.serve_client import completion_body, random_prompts, run_load
from loadtest.serving.serve_stats import RequestResult, distribution_ms, meets_slos, parse_slos, summarize
from tests.standin import ThreadServer


def test_distribution_in_ms():
    d = distribution_ms([0.001 * i for i in range(1, 101)])  # 1..100 ms
    assert d["mean"] == pytest.approx(50.5)
    assert d["median"] == pytest.approx(50.5)
    assert d["p90"] == pytest.approx(90.1)
    assert d["p99"] == pytest.approx(99.01)
    assert distribution_ms([]) == {"mean": None, "median": None, "p90": None, "p99": None}


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
    return (
        METRICS_BEFORE.replace("1000.0", f"{prompt}.0")
        .replace("pdspec_proposals_total 10.0", f"pdspec_proposals_total {proposals}.0")
        .replace("pdspec_k0_proposals_total 10.0", f"pdspec_k0_proposals_total {k0}.0")
        .replace('model_name="m"} 100.0', f'model_name="m"}} {drafts}.0')
        .replace('model_name="m"} 50.0', f'model_name="m"}} {accepted}.0')
    )


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


def _phase(
    index: int,
    policy: str | None,
    prefill_rate: float,
    k0: int,
    proposals: int,
    share: float | None = None,
    saturated_rate: float | None = None,
) -> dict:
    """A phase as run_benchmark writes one; with `share`, as if its queue had been sampled."""
    results = [RequestResult(True, 64, 4, 0.1, 0.4, [0.1, 0.1, 0.1])]
    prefill = {
        worker_metrics.PROMPT_TOKENS: prefill_rate,
        worker_metrics.PROPOSALS: proposals,
        worker_metrics.K0_PROPOSALS: k0,
    }
    queue = dict.fromkeys(serve_bench.SATURATION_FIELDS)
    if share is not None:
        queue = {
            "prefill_saturation_share": share,
            "prefill_tokens_per_s_saturated": saturated_rate,
            "prefill_queue_samples": 40,
            "prefill_queue_gaps": 0,
            "saturated": share >= serve_bench.DEFAULT_SATURATION_MIN,
        }
    return {
        "index": index,
        "repetition": index // 2,
        "policy": policy,
        "concurrency": 2,
        "request_rate": None,
        "load": "concurrency 2",
        **summarize(results, 1.0),
        **worker_metrics.worker_figures(prefill, None, 1.0),
        **queue,
    }


def test_ab_summary_table_and_files(tmp_path):
    phases = [
        _phase(0, "auto", 1100, 8, 8),
        _phase(1, "always", 1000, 0, 8),
        _phase(2, "always", 1000, 0, 8),
        _phase(3, "auto", 1050, 8, 8),
    ]
    summary = serve_report.ab_summary(phases)
    assert len(summary) == 1
    row = summary[0]
    assert row["auto_prefill_tokens_per_s"] == pytest.approx(1075)
    assert row["auto_vs_always_pct"] == pytest.approx(7.5)
    assert row["pair_ratios"] == pytest.approx([1.1, 1.05])
    assert row["k0_proposals"] == {"auto": 16, "always": 0} and row["proposals"] == {"auto": 16, "always": 16}
    # Phases without queue readings (no sampler) all count, by their whole-phase rate.
    assert row["rate_source"] == "prefill_tokens_per_s"
    assert (row["pairs_used"], row["excluded_pairs"], row["unsaturated_phases"]) == (2, 0, {"auto": 0, "always": 0})
    assert row["pair_ratio_mean"] == pytest.approx(1.075) and row["pair_ratio_ci95"] == pytest.approx([1.05, 1.1])
    report = {
        "label": "cpu",
        "command": "python -m loadtest.serve_bench --ab",
        "url": "http://p",
        "model": "m",
        "num_prompts": 1,
        "input_len": 64,
        "output_len": 4,
        "ab": True,
        "phases": phases,
        "ab_summary": summary,
    }
    table = serve_report.markdown(report)
    assert "| concurrency 2 | 1,000 | 1,075 | +7.5% | 1.050..1.100 | 16 / 16 | 0 / 16 |" in table
    assert table.count("| concurrency 2 | auto |") == 2 and table.count("| concurrency 2 | always |") == 2
    written = serve_report.write(report, tmp_path)
    names = {p.name for p in written}
    assert {"serve_bench.json", "serve_bench.md", "serve_bench_latency.png", "serve_bench_ab.png"} <= names
    data = json.loads((tmp_path / "serve_bench.json").read_text())
    for field in (
        "policy",
        "requests",
        "failed",
        "ttft_ms",
        "itl_ms",
        "output_tokens_per_s",
        "prefill_tokens_per_s",
        "prefill_proposals",
        "prefill_k0_proposals",
        "decode_acceptance_length",
    ):
        assert field in data["phases"][0]
    assert set(data["phases"][0]["ttft_ms"]) == {"mean", "median", "p90", "p99"}


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


def test_saturation_fields_flag_a_phase_below_the_minimum():
    assert serve_bench.saturation_fields(None, 0.89) == dict.fromkeys(serve_bench.SATURATION_FIELDS)
    waiting = [QueueSample(float(t), waiting=w, running=1, prompt_tokens=100.0 * t) for t, w in enumerate([3, 2, 1, 0])]
    fields = serve_bench.saturation_fields(waiting, 0.75)
    assert fields["prefill_saturation_share"] == pytest.approx(0.75) and fields["saturated"] is True
    assert fields["prefill_tokens_per_s_saturated"] == pytest.approx(100.0)
    assert (fields["prefill_queue_samples"], fields["prefill_queue_gaps"]) == (4, 0)
    assert serve_bench.saturation_fields(waiting, 0.89)["saturated"] is False
    # No reading at all shows nothing saturated.
    gaps = serve_bench.saturation_fields([QueueSample(0.0, None), QueueSample(1.0, None)], 0.0)
    assert gaps["saturated"] is False and gaps["prefill_saturation_share"] is None and gaps["prefill_queue_gaps"] == 2


def test_saturation_minimum_argument():
    assert serve_bench.parse_args(["--url", "http://x"]).saturation_min == 0.89
    assert serve_bench.parse_args(["--url", "http://x", "--saturation-min", "0.5"]).saturation_min == 0.5
    with pytest.raises(SystemExit):
        serve_bench.parse_args(["--url", "http://x", "--saturation-min", "1.5"])


def _ab_phases_with_one_unsaturated() -> list[dict]:
    """ABBA over 3 repetitions; phase 3 (`always`) never saturated the prefill worker, and
    its pair's rates would swing the figures if it were counted."""
    return [
        _phase(0, "auto", 900, 8, 8, share=0.97, saturated_rate=1100),
        _phase(1, "always", 900, 0, 8, share=0.95, saturated_rate=1000),
        _phase(2, "always", 100, 0, 8, share=0.40, saturated_rate=100),
        _phase(3, "auto", 4000, 8, 8, share=0.99, saturated_rate=5000),
        _phase(4, "auto", 900, 8, 8, share=0.93, saturated_rate=1200),
        _phase(5, "always", 900, 0, 8, share=0.90, saturated_rate=1000),
    ]


def test_ab_summary_leaves_out_a_pair_with_an_unsaturated_phase():
    (row,) = serve_report.ab_summary(_ab_phases_with_one_unsaturated())
    # Pairs in run order: (0, 1), (3, 2), (4, 5); (3, 2) is out.
    assert (row["pairs_used"], row["excluded_pairs"]) == (2, 1)
    assert row["unsaturated_phases"] == {"auto": 0, "always": 1}
    assert row["rate_source"] == "prefill_tokens_per_s_saturated"
    assert row["auto_prefill_tokens_per_s"] == pytest.approx(1150) and row["always_prefill_tokens_per_s"] == 1000
    assert row["auto_vs_always_pct"] == pytest.approx(15.0)
    assert row["pair_ratios"] == pytest.approx([1.1, 1.2]) and row["pair_ratio_mean"] == pytest.approx(1.15)
    # Two ratios: resampled means are 1.1, 1.15 or 1.2, so the interval is their range.
    assert row["pair_ratio_ci95"] == pytest.approx([1.1, 1.2])
    assert row["auto_vs_always_pct_ci95"] == pytest.approx([10.0, 20.0])
    # Proposals still cover every phase: they say what each policy did.
    assert row["proposals"] == {"auto": 24, "always": 24} and row["phases_per_policy"] == 3


def test_ab_summary_with_one_pair_or_none_saturated():
    one = serve_report.ab_summary(_ab_phases_with_one_unsaturated()[:2])[0]
    assert one["pair_ratios"] == pytest.approx([1.1]) and one["pair_ratio_mean"] == pytest.approx(1.1)
    assert one["pair_ratio_ci95"] is None and one["auto_vs_always_pct_ci95"] is None
    none = serve_report.ab_summary(_ab_phases_with_one_unsaturated()[2:4])[0]
    assert (none["pairs_used"], none["excluded_pairs"]) == (0, 1)
    assert none["auto_prefill_tokens_per_s"] is None and none["auto_vs_always_pct"] is None
    assert none["pair_ratio_mean"] is None and none["rate_source"] is None


def test_bootstrap_interval_is_fixed_by_its_seed_and_holds_the_mean():
    ratios = [0.97, 1.01, 1.04, 0.99, 1.08, 1.02, 0.95, 1.05]
    low, high = serve_report.bootstrap_ci95(ratios)
    assert serve_report.bootstrap_ci95(ratios) == [low, high]  # the same pairs, the same interval
    assert serve_report.bootstrap_ci95(ratios, seed=1) != [low, high]
    mean = sum(ratios) / len(ratios)
    # A percentile interval of the mean: around it, and narrower than the ratios' range.
    assert min(ratios) < low < mean < high < max(ratios)
    assert serve_report.bootstrap_ci95([1.1]) is None and serve_report.bootstrap_ci95([]) is None


def test_markdown_flags_unsaturated_phases_and_shows_the_interval(tmp_path):
    phases = _ab_phases_with_one_unsaturated()
    report = {
        "label": "",
        "command": "python -m loadtest.serve_bench --ab",
        "url": "http://p",
        "model": "m",
        "num_prompts": 1,
        "input_len": 64,
        "output_len": 4,
        "ab": True,
        "saturation_min": 0.89,
        "phases": phases,
        "ab_summary": serve_report.ab_summary(phases),
    }
    table = serve_report.markdown(report)
    assert (
        "**1 phases never saturated the prefill worker** (requests waiting in fewer than 89% of its queue "
        "readings), left out of the A/B figures: #3 concurrency 2 always 40% (unsaturated)"
    ) in table
    assert (
        "| 1,000 | 1,150 | +15.0% | 1.100..1.200 | 24 / 24 | 0 / 24 | +10.0%..+20.0% | 2 / 1 | saturated window |"
        in table
    )
    assert table.count("(unsaturated) |") == 1 and "| 1,100 | 97% |" in table
    assert "serve_bench_ab.png" in {p.name for p in serve_report.write(report, tmp_path)}
    # No saturated pair at all: the row's figures read "-", nothing breaks.
    late = {**report, "phases": phases[2:4], "ab_summary": serve_report.ab_summary(phases[2:4])}
    assert "| concurrency 2 | - | - | - | - |" in serve_report.markdown(late)
    serve_report.plot_ab(late, tmp_path / "late.png")


def _queueing_app(capacity: int) -> FastAPI:
    """Completions that stream 4 chunks; its /metrics counts the requests over `capacity`
    in flight as waiting, and a request's prompt tokens once its stream is done."""
    app = _sse_app(gap_s=0.05, tokens=4)
    state = {"in_flight": 0, "prompt_tokens": 0}

    @app.middleware("http")
    async def count(request: Request, call_next):
        if request.url.path != "/v1/completions":
            return await call_next(request)
        body = await request.body()
        state["in_flight"] += 1
        response = await call_next(request)

        async def stream():
            try:
                async for chunk in response.body_iterator:
                    yield chunk
            finally:
                state["in_flight"] -= 1
                state["prompt_tokens"] += len(json.loads(body)["prompt"])

        return StreamingResponse(stream(), status_code=response.status_code, media_type="text/event-stream")

    @app.get("/metrics")
    async def metrics():
        waiting, running = max(0, state["in_flight"] - capacity), min(capacity, state["in_flight"])
        return Response(
            f"vllm:num_requests_waiting {waiting}.0\nvllm:num_requests_running {running}.0\n"
            f"vllm:prompt_tokens_total {state['prompt_tokens']}.0\n",
            media_type="text/plain",
        )

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "m"}]}

    return app


def _no_local_stack(monkeypatch):
    # The tests give every URL: pdspec's own settings (and its model folder) play no part.
    defaults = {"prefill_url": None, "decode_url": None, "run_dir": None, "vocab_size": None}
    monkeypatch.setattr(serve_bench, "local_stack_defaults", lambda: defaults)


def test_run_benchmark_samples_the_prefill_queue_in_measured_phases(monkeypatch):
    _no_local_stack(monkeypatch)
    with ThreadServer(_queueing_app(capacity=1)) as server:
        args = serve_bench.parse_args(
            [
                "--url",
                server.url,
                "--prefill-url",
                server.url,
                "--decode-url",
                server.url,
                "--num-prompts",
                "6",
                "--concurrency",
                "3",
                "--input-len",
                "16",
                "--output-len",
                "4",
                "--vocab-size",
                "4096",
                "--warmup",
                "2",
                "--saturation-min",
                "0.5",
                "--no-progress",
            ]
        )
        report = serve_bench.run_benchmark(args)
    (phase,) = report["phases"]
    assert report["saturation_min"] == 0.5 and phase["failed"] == 0
    # Read at the start, every 0.25 s and at the end of the ~0.5 s phase, with no gap.
    assert phase["prefill_queue_samples"] >= 2 and phase["prefill_queue_gaps"] == 0
    # Three in flight for one place from the first request to the last round's end: the
    # 0.25 s reading finds requests waiting, and the counter grows after it.
    assert 0.0 < phase["prefill_saturation_share"] <= 1.0 and phase["prefill_tokens_per_s_saturated"] > 0
    assert phase["saturated"] == (phase["prefill_saturation_share"] >= 0.5)
    # The idle readings around the phase: its 6 prompts, none of the warm-up's 2.
    assert phase["workers"]["prefill"][worker_metrics.PROMPT_TOKENS] == 6 * 16


def test_without_worker_metrics_the_queue_fields_are_none(monkeypatch):
    _no_local_stack(monkeypatch)
    with ThreadServer(_queueing_app(capacity=1)) as server:
        args = serve_bench.parse_args(
            [
                "--url",
                server.url,
                "--no-worker-metrics",
                "--num-prompts",
                "2",
                "--input-len",
                "8",
                "--output-len",
                "2",
                "--vocab-size",
                "4096",
                "--no-progress",
            ]
        )
        (phase,) = serve_bench.run_benchmark(args)["phases"]
    assert {name: phase[name] for name in serve_bench.SATURATION_FIELDS} == dict.fromkeys(serve_bench.SATURATION_FIELDS)


def test_vllm_random_prompts_are_vllms_random_dataset_for_the_seed():
    """`--dataset vllm-random`: the texts `vllm bench serve --dataset-name random --seed S`
    sends, so both tools can be run on one workload (loadtest/micro/bench_tools.py)."""
    from transformers import AutoTokenizer

    from loadtest.serving.serve_client import vllm_random_prompts
    from pdspec.models.build import install_models
    from tests.harness import models_dir

    install_models(models_dir())  # a no-op once installed (`make test` does it first)
    target = models_dir() / "target"
    first, again, other = (vllm_random_prompts(4, 64, target, seed) for seed in (3, 3, 4))
    assert first == again and first != other and len(first) == 4
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert all(abs(len(tokenizer.encode(p, add_special_tokens=False)) - 64) <= 1 for p in first)


def test_prefix_repetition_arguments_are_checked():
    args = serve_bench.parse_args(
        ["--url", "http://x", "--dataset", "vllm-prefix-repetition", "--prefix-len", "64"]
        + ["--suffix-len", "16", "--num-prefixes", "4", "--num-prompts", "8", "--request-rate", "3"]
    )
    assert (args.prefix_len, args.suffix_len, args.num_prefixes, args.input_len) == (64, 16, 4, 80)
    shape = ["--dataset", "vllm-prefix-repetition", "--prefix-len", "64", "--suffix-len", "16"]
    for wrong in (
        shape + ["--num-prefixes", "4", "--num-prompts", "6"],  # not a multiple: vLLM would send 4
        shape + ["--num-prefixes", "4", "--num-prompts", "8", "--warmup", "2"],
        shape + ["--num-prompts", "8"],  # no --num-prefixes
        shape + ["--num-prefixes", "0"],
        ["--prefix-len", "64"],  # the uniform dataset has no prefix
        ["--dataset", "vllm-random", "--num-prefixes", "4"],
    ):
        with pytest.raises(SystemExit):
            serve_bench.parse_args(["--url", "http://x", *wrong])
