"""serve_bench's `--arrivals vllm`: the instants `vllm bench serve` sends at, checked against
vLLM's own code. vLLM's `get_request` (and, end to end, its `main_async` from the seeding
through the dataset sampling) runs here with `time.time` and `asyncio.sleep` of
`vllm.benchmarks.serve` replaced by a fake clock that records each send instant: no server,
no real wait.

vLLM 0.33.0 (the GPU machines') sends on the same schedule: its `get_request`, its
`PrefixRepetitionRandomDataset` and `RandomDataset` are the same source as 0.32.0's, and
`main_async` differs only in two result fields (compared 2026-12-05, from the staged
0.33.0 wheel; the GPU's vLLM does not install here, so this test runs 0.32.0's code)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loadtest.micro import bench_tools
from loadtest.serving import serve_bench
from loadtest.serving.serve_client import RequestResult, run_load, vllm_send_offsets

START = 1000.0  # the fake clock's reading when get_request starts


async def fake_clock_instants(requests: list, rate: float, burstiness: float) -> list[float]:
    """vLLM's get_request over `requests`, from numpy's global state as it stands, on a fake
    clock: each request's send instant, from the start."""
    from vllm.benchmarks import serve as vllm_serve

    clock = {"now": START}

    async def sleep(seconds: float) -> None:
        clock["now"] += seconds

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_serve, "time", SimpleNamespace(time=lambda: clock["now"]))
        patch.setattr(vllm_serve, "asyncio", SimpleNamespace(sleep=sleep))
        return [clock["now"] - START async for _ in vllm_serve.get_request(requests, rate, burstiness)]


def vllm_instants(count: int, rate: float, burstiness: float = 1.0) -> list[float]:
    return asyncio.run(fake_clock_instants([SimpleNamespace(timestamp=None) for _ in range(count)], rate, burstiness))


def same_state(a, b) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    drawn_before=st.integers(0, 40),  # what a dataset sampler drew from numpy's state first
    count=st.integers(1, 200),
    rate=st.floats(0.01, 1000.0),
    burstiness=st.sampled_from([1.0, 0.25, 3.0]) | st.floats(0.05, 20.0),
)
@example(seed=41, drawn_before=0, count=32, rate=2.0, burstiness=1.0)  # the CPU dry run's shape
@example(seed=0, drawn_before=0, count=1, rate=4.0, burstiness=1.0)
def test_the_offsets_are_vllms_get_request_instants(seed, drawn_before, count, rate, burstiness):
    """Differential: from one numpy state, serve_bench's offsets equal the instants vLLM's
    get_request sends at (to 1e-9 s), and both leave numpy's state where the other does."""
    np.random.seed(seed)
    np.random.randint(0, 1000, size=drawn_before)
    state = np.random.get_state()
    ours = vllm_send_offsets(count, rate, burstiness)
    after_ours = np.random.get_state()
    np.random.set_state(state)
    theirs = vllm_instants(count, rate, burstiness)
    assert len(ours) == len(theirs) == count
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= 1e-9
    assert ours[-1] == pytest.approx(count / rate)  # vLLM's rescaling: the last leaves at n / rate
    assert same_state(after_ours, np.random.get_state())


def test_no_schedule_without_a_finite_positive_rate():
    for count, rate, burstiness in ((0, 1.0, 1.0), (3, 0.0, 1.0), (3, float("inf"), 1.0), (3, 1.0, 0.0)):
        with pytest.raises(ValueError):
            vllm_send_offsets(count, rate, burstiness)


# --- end to end of the sampling: vLLM's main against serve_bench's phase --------------------

PREFIX_LEN, SUFFIX_LEN, NUM_PREFIXES, NUM_PROMPTS, INPUT_LEN = 48, 12, 3, 9, 64
DATASET_FLAGS = {
    "vllm-prefix-repetition": (
        ["--prefix-len", str(PREFIX_LEN), "--suffix-len", str(SUFFIX_LEN), "--num-prefixes", str(NUM_PREFIXES)],
        ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(PREFIX_LEN)]
        + ["--prefix-repetition-suffix-len", str(SUFFIX_LEN), "--prefix-repetition-num-prefixes", str(NUM_PREFIXES)]
        + ["--prefix-repetition-output-len", "5"],
    ),
    "vllm-random": (
        ["--input-len", str(INPUT_LEN)],
        ["--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", "5"],
    ),
}


class Captured(Exception):
    pass


def vllm_main_schedule(dataset: str, seed: int, rate: float, tokenizer: str) -> tuple[list[str], list[float]]:
    """`vllm bench serve` as bench_tools runs it, through vLLM's own main_async: its seeding,
    tokenizer and dataset sampling, then get_request on the fake clock in place of the
    benchmark (no server: the prompts' alignment to it left out, it draws nothing)."""
    from vllm.benchmarks import serve as vllm_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    vllm_serve.add_cli_args(parser)
    args = parser.parse_args(
        ["--backend", "openai", "--base-url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", tokenizer]
        + DATASET_FLAGS[dataset][1]
        + ["--num-prompts", str(NUM_PROMPTS), "--request-rate", str(rate), "--seed", str(seed), "--num-warmups", "0"]
    )
    seen = {}

    async def benchmark(**kwargs):
        requests = kwargs["input_requests"]
        seen["prompts"] = [r.prompt for r in requests]
        seen["instants"] = await fake_clock_instants(requests, kwargs["request_rate"], kwargs["burstiness"])
        raise Captured

    async def aligned(base_url, model_id, input_requests, ssl_context=None):
        return input_requests

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_serve, "benchmark", benchmark)
        patch.setattr(vllm_serve, "_align_prompts_to_server_tokenizer", aligned)
        try:
            with pytest.raises(Captured):
                vllm_serve.main(args)
        finally:
            gc.unfreeze()  # main_async freezes the heap before its benchmark
    return seen["prompts"], seen["instants"]


@pytest.fixture(scope="module")
def tokenizer() -> str:
    from pdspec.models.build import install_models
    from tests.harness import models_dir

    install_models(models_dir())  # a no-op once installed (`make test` does it first)
    return str(models_dir() / "target")


@pytest.mark.parametrize("dataset", sorted(DATASET_FLAGS))
@pytest.mark.parametrize("seed, rate", [(3, 40.0), (41, 2.0)])
def test_a_phase_sends_vllms_prompts_at_vllms_instants(dataset, seed, rate, tokenizer, monkeypatch):
    """serve_bench's phase 0 with `--arrivals vllm` (make_prompts: the sampling, then the
    offsets) against vLLM's main for the same flags: the same texts and the same instants."""
    from vllm.benchmarks import serve as vllm_serve

    theirs = vllm_main_schedule(dataset, seed, rate, tokenizer)

    async def aligned(base_url, model_id, input_requests, ssl_context=None):
        return input_requests

    monkeypatch.setattr(vllm_serve, "_align_prompts_to_server_tokenizer", aligned)
    argv = ["--url", "http://127.0.0.1:9", "--dataset", dataset, *DATASET_FLAGS[dataset][0]]
    argv += ["--num-prompts", str(NUM_PROMPTS), "--request-rate", str(rate), "--seed", str(seed)]
    args = serve_bench.parse_args([*argv, "--arrivals", "vllm"])
    np.random.seed(12345)  # whatever state the process was in: the phase seeds as vLLM does
    prompts, offsets = serve_bench.make_prompts(args, NUM_PROMPTS, 0, tokenizer, args.seed + 0, "m", rate)
    assert prompts == theirs[0] and len(prompts) == NUM_PROMPTS
    assert max(abs(a - b) for a, b in zip(offsets, theirs[1])) <= 1e-9 and len(offsets) == NUM_PROMPTS
    own = serve_bench.parse_args(argv)  # default --arrivals own: no offsets
    assert serve_bench.make_prompts(own, NUM_PROMPTS, 0, tokenizer, seed, "m", rate)[1] is None


# --- sending at the offsets, and where they do not apply ------------------------------------


def test_run_load_sends_each_request_at_its_offset(monkeypatch):
    """Body i goes out no earlier than its offset from the start, in order, close to it on
    an idle loop; the window counts from the start, as vLLM's duration does (the first
    request's own wait included); and a rate given alongside is not used."""
    sent: list[tuple[int, float]] = []

    async def stream(client, url, body):
        sent.append((body["i"], time.perf_counter()))
        return RequestResult(True, 1, 1, 0.001, 0.001, [])

    monkeypatch.setattr("loadtest.serving.serve_client.stream_completion", stream)
    offsets = [0.05, 0.1, 0.1, 0.3]
    before = time.perf_counter()
    results, window = asyncio.run(
        run_load("http://unused", [{"i": i} for i in range(4)], None, 1000.0, offsets=offsets)
    )
    assert [i for i, _ in sent] == [0, 1, 2, 3] and all(r.ok for r in results)
    late = [at - before - offset for (_, at), offset in zip(sent, offsets)]
    assert all(0 <= s < 0.25 for s in late), late  # loose above: a shared CPU
    assert window >= 0.3
    with pytest.raises(ValueError, match="3 send offsets for 4 requests"):
        asyncio.run(run_load("http://unused", [{"i": i} for i in range(4)], None, 1.0, offsets=offsets[:3]))


def test_vllm_arrivals_are_refused_where_there_is_no_such_schedule():
    base = ["--url", "http://x", "--arrivals", "vllm"]
    for wrong in (
        ["--dataset", "vllm-random", "--concurrency", "4"],  # concurrency phases: all at once
        ["--dataset", "vllm-random"],
        ["--request-rate", "2"],  # the uniform dataset: not vLLM's sampling
    ):
        with pytest.raises(SystemExit):
            serve_bench.parse_args([*base, *wrong])
    args = serve_bench.parse_args([*base, "--dataset", "vllm-random", "--request-rate", "2", "4", "--warmup", "2"])
    assert args.arrivals == "vllm" and serve_bench.parse_args(["--url", "http://x"]).arrivals == "own"


def test_bench_tools_asks_for_vllms_instants_at_a_rate_only_on_vllms_prompts():
    def parse(*extra: str) -> argparse.Namespace:
        return bench_tools.parse_args(["--url", "http://x", "--tokenizer", "t", "--out", "/o", *extra])

    rate = parse("--request-rate", "2")
    assert bench_tools.load_argv(rate, "serve_bench_vllm_prompts") == ["--request-rate", "2.0", "--arrivals", "vllm"]
    assert bench_tools.load_argv(rate, "serve_bench") == ["--request-rate", "2.0"]  # uniform: its own draw
    assert "--arrivals" not in bench_tools.load_argv(parse(), "serve_bench_vllm_prompts")  # all at once
    # Every serve_bench argv that bench_tools builds is one serve_bench accepts.
    for args in (rate, parse()):
        for tool in ("serve_bench", "serve_bench_vllm_prompts"):
            argv = bench_tools.tool_argv(tool, args, bench_tools.Path("/o"), 3)
            serve_bench.parse_args(argv[3:])


def test_the_report_says_whether_the_tools_sent_at_the_same_instants():
    report = {"request_rate": 2.0, "dataset": "prefix-repetition", "rounds": [{"arrivals": {}}, {"arrivals": {}}]}
    for round_ in report["rounds"]:
        round_["arrivals"]["serve_bench_vllm_prompts"] = "vllm"
    (line,) = bench_tools.arrival_lines(report)
    assert "sent at the same instants as `vllm bench serve`" in line and "in every round" in line
    report["rounds"][1]["arrivals"]["serve_bench_vllm_prompts"] = "own"
    assert "each tool drew its own Poisson instants" in bench_tools.arrival_lines(report)[0]
    assert bench_tools.arrival_lines({**report, "request_rate": None}) == []
