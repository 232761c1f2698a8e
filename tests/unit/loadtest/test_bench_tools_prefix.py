"""bench_tools on the prefix-repetition dataset at a request rate, against a server that
stands in for one worker behind a proxy: it streams replies, keeps a prefix cache of the
texts it was sent (hit characters: the longest common start with any earlier prompt since
its last reset), exports vLLM's prefix-cache counters, and resets on
/reset_prefix_cache. Both tools must send it the same texts in the same order, each run
from an empty cache, and so read the same hit rate; here that rate is exact, as this
cache, unlike a real one, neither evicts nor depends on timing."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from loadtest.micro import bench_tools
from loadtest.serving.serve_client import vllm_prefix_repetition_prompts
from tests.harness import models_dir
from tests.standin import ThreadServer

PREFIX_LEN, SUFFIX_LEN, NUM_PREFIXES, NUM_PROMPTS, OUTPUT_LEN = 64, 16, 3, 12, 6


class CachingServer:
    def __init__(self) -> None:
        self.runs: list[list[str]] = []  # the texts received after each reset, in order
        self.cached: list[str] = []
        self.hits = self.queries = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "pdspec-tiny", "root": "pdspec-tiny", "max_model_len": 2048}]}

        @app.post("/reset_prefix_cache")
        async def reset():
            self.cached, self.runs = [], [*self.runs, []]
            return {"success": True}

        @app.get("/metrics")
        async def metrics():
            return PlainTextResponse(
                "# TYPE vllm:prefix_cache_hits counter\n"
                f"vllm:prefix_cache_hits_total {float(self.hits)}\n"
                "# TYPE vllm:prefix_cache_queries counter\n"
                f"vllm:prefix_cache_queries_total {float(self.queries)}\n"
            )

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            prompt, tokens = body["prompt"], body["max_tokens"]
            if isinstance(prompt, str):  # the reset's own one-token request is a list of ids
                self.hits += max((len(os.path.commonprefix([prompt, seen])) for seen in self.cached), default=0)
                self.queries += len(prompt)
                self.cached.append(prompt)
                self.runs[-1].append(prompt)
            if not body.get("stream"):
                return JSONResponse({"choices": [{"index": 0, "text": " a", "finish_reason": "length"}]})

            async def events():
                for sent in range(1, tokens + 1):
                    await asyncio.sleep(0.002)
                    choice = {"index": 0, "text": " a", "finish_reason": "length" if sent == tokens else None}
                    yield f"data: {json.dumps({'id': 'x', 'object': 'text_completion', 'choices': [choice]})}\n\n"
                usage = {"prompt_tokens": PREFIX_LEN + SUFFIX_LEN, "completion_tokens": tokens}
                yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        return app


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("prefix")
    server = CachingServer()
    with ThreadServer(server.app()) as http:
        report = bench_tools.main(
            ["--url", http.url, "--prefill-url", http.url, "--tokenizer", str(models_dir() / "target")]
            + ["--dataset", "prefix-repetition", "--prefix-len", str(PREFIX_LEN), "--suffix-len", str(SUFFIX_LEN)]
            + ["--num-prefixes", str(NUM_PREFIXES), "--num-prompts", str(NUM_PROMPTS)]
            + ["--output-len", str(OUTPUT_LEN), "--request-rate", "40", "--rounds", "1", "--seed", "3"]
            + ["--out", str(out)]
        )
    return report, server, out


def test_both_tools_send_vllms_texts_in_its_order_each_from_an_empty_cache(run):
    report, server, _ = run
    expected = vllm_prefix_repetition_prompts(
        NUM_PROMPTS, PREFIX_LEN, SUFFIX_LEN, NUM_PREFIXES, models_dir() / "target", seed=3
    )
    assert len(server.runs) == 2  # one reset before each of the two runs
    for received in server.runs:
        assert sorted(received) == sorted(expected)
        # In vLLM's order, as sent: the server sees arrivals, and two requests sent a few ms
        # apart can arrive swapped on a loaded machine (seen in one run), so each may sit at
        # most 2 places from its own.
        place = {text: index for index, text in enumerate(expected)}
        assert max(abs(place[text] - index) for index, text in enumerate(received)) <= 2, received
    assert report["resets_refused"] == [] and report["rounds"][0]["order"] == list(
        bench_tools.DATASET_TOOLS["prefix-repetition"]
    )
    # ... and at vLLM's instants for the seed and rate, as serve_bench's own result file says.
    assert report["rounds"][0]["arrivals"] == {"serve_bench_vllm_prompts": "vllm"}


def test_the_two_runs_read_the_same_hit_rate_the_cache_gave(run):
    report, server, _ = run
    (round_,) = report["rounds"]
    theirs = round_[bench_tools.VLLM]["prefill_prefix_cache_hit_rate"]
    ours = round_["serve_bench_vllm_prompts"]["prefill_prefix_cache_hit_rate"]
    # 9 of the 12 prompts come back to a tenant seen before: most of their text is a hit.
    assert ours == theirs and 0.5 < ours < 0.9
    assert server.hits / server.queries == pytest.approx(ours)  # two equal runs: the same share
    for tool in bench_tools.DATASET_TOOLS["prefix-repetition"]:
        assert round_[tool]["completed"] == NUM_PROMPTS and round_[tool]["output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
        assert round_[tool]["ttft_ms_p90"] >= round_[tool]["ttft_ms_median"] > 0


def test_the_files_show_the_hit_rate_row(run):
    report, _, out = run
    text = (out / "bench_tools.md").read_text()
    assert "| prefill_prefix_cache_hit_rate |" in text and "Poisson arrivals at 40/s" in text
    assert "sent at the same instants as `vllm bench serve`" in text
    assert report["summary_vllm_prompts"]["prefill_prefix_cache_hit_rate"]["ratios"] == [1.0]
    assert (out / "bench_tools.png").exists() and json.loads((out / "bench_tools.json").read_text())["rounds"]
