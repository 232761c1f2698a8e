"""serve_bench and vLLM's `vllm bench serve` time the same things: both tools, run by
`loadtest.micro.bench_tools`, against a server whose timing is known because it sets it
(first chunk after TTFT_S, then a chunk of TOKENS_PER_CHUNK tokens every CHUNK_GAP_S, as a
speculative decoder sends them). Each tool's TTFT, ITL, TPOT and throughput must match
the pacing and the other tool's. On a real stack (tests/e2e/test_bench_tools_agree.py)
this 2-core machine's noise moves timed figures by up to 2x between runs, so there the
tools are held to the same accounting; here the server, not the machine, sets the time."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from loadtest.micro import bench_tools
from tests.harness import models_dir
from tests.standin import ThreadServer

TTFT_S, CHUNK_GAP_S, TOKENS_PER_CHUNK = 0.15, 0.03, 2
OUTPUT_LEN, NUM_PROMPTS, CONCURRENCY = 24, 12, 2


def paced_server() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "pdspec-tiny", "object": "model", "max_model_len": 2048}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        tokens = body["max_tokens"]

        async def events():
            await asyncio.sleep(TTFT_S)
            sent = 0
            while sent < tokens:
                count = min(TOKENS_PER_CHUNK, tokens - sent)
                sent += count
                finish = "length" if sent == tokens else None
                choice = {"index": 0, "text": " a" * count, "finish_reason": finish}
                yield f"data: {json.dumps({'id': 'x', 'object': 'text_completion', 'choices': [choice]})}\n\n"
                if sent < tokens:
                    await asyncio.sleep(CHUNK_GAP_S)
            usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
            yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("paced")
    with ThreadServer(paced_server()) as server:
        return bench_tools.main(
            [
                "--url",
                server.url,
                "--tokenizer",
                str(models_dir() / "target"),
                "--input-len",
                "32",
                "--output-len",
                str(OUTPUT_LEN),
                "--num-prompts",
                str(NUM_PROMPTS),
                "--concurrency",
                str(CONCURRENCY),
                "--rounds",
                "1",
                "--out",
                str(out),
            ]
        )


def test_both_tools_count_every_request_and_token(report):
    (round_,) = report["rounds"]
    for tool in bench_tools.TOOLS:
        assert round_[tool]["completed"] == NUM_PROMPTS, tool
        assert round_[tool]["output_tokens"] == NUM_PROMPTS * OUTPUT_LEN, tool


@pytest.mark.parametrize(
    "figure", ["ttft_ms_median", "itl_ms_median", "tpot_ms_median", "output_tokens_per_s", "duration_s"]
)
def test_the_tools_agree_on_each_timed_figure(report, figure):
    for key in ("summary", "summary_vllm_prompts"):
        ratio = report[key][figure]["ratio_median"]
        assert 0.9 <= ratio <= 1.1, (key, figure, report[key][figure])


def test_the_timed_figures_are_the_servers_pacing(report):
    chunks = OUTPUT_LEN // TOKENS_PER_CHUNK
    latency_s = TTFT_S + (chunks - 1) * CHUNK_GAP_S
    expected = {
        "ttft_ms_median": TTFT_S * 1000,
        "itl_ms_median": CHUNK_GAP_S * 1000,
        "tpot_ms_median": (chunks - 1) * CHUNK_GAP_S * 1000 / (OUTPUT_LEN - 1),
        "output_tokens_per_s": CONCURRENCY * OUTPUT_LEN / latency_s,
    }
    (round_,) = report["rounds"]
    for tool in bench_tools.TOOLS:
        for figure, value in expected.items():
            # Above the pacing by the machine's overhead (loopback, event loops), never below it.
            assert 0.97 * value <= round_[tool][figure] <= 1.3 * value or figure == "output_tokens_per_s", (
                tool,
                figure,
                round_[tool][figure],
                value,
            )
        throughput = round_[tool]["output_tokens_per_s"]
        assert 0.75 * expected["output_tokens_per_s"] <= throughput <= 1.03 * expected["output_tokens_per_s"], tool
