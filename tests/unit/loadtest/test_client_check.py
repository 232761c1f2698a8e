"""client_check's plumbing (loadtest/serving/client_check.py): bench_tools gets the front,
the model, every worker of the fleet and its output folder; flags it fills in are refused
after `--`; and bench_tools' flags are checked before any fleet starts."""

import pytest

from loadtest.serving import client_check, fleet_bench

FLEET = ["--out", "/tmp/cc", "--kv-blocks", "64", "--base-port", "19000", "--prefill-port", "19100"]
FLEET += ["--decode-port", "19200", "--model", "m"]
SHAPE = ["--dataset", "prefix-repetition", "--prefix-len", "64", "--suffix-len", "16", "--num-prefixes", "4"]
SHAPE += ["--num-prompts", "8", "--request-rate", "2", "--tokenizer", "/tok"]


def test_bench_tools_gets_the_front_and_every_worker():
    ours, rest = client_check.split_argv([*FLEET, "--", *SHAPE])
    assert ours == FLEET and rest == SHAPE
    workers = {"prefill": ["http://p0", "http://p1"], "decode": ["http://d0"]}

    class Args:
        model, out = "m", client_check.Path("/tmp/cc")

    argv = client_check.bench_tools_argv(Args, workers, "http://front", rest)
    assert argv[: len(SHAPE)] == SHAPE
    assert argv[len(SHAPE) :] == [
        "--url",
        "http://front",
        "--model",
        "m",
        "--out",
        "/tmp/cc/bench_tools",
        "--prefill-url",
        "http://p0",
        "--prefill-url",
        "http://p1",
        "--decode-url",
        "http://d0",
    ]
    with pytest.raises(SystemExit, match="--url"):
        client_check.bench_tools_argv(Args, workers, "http://front", [*SHAPE, "--url=http://elsewhere"])


def test_a_bad_bench_tools_flag_stops_the_check_before_the_fleet_starts(monkeypatch):
    started = []
    monkeypatch.setattr(fleet_bench, "start_fleet", lambda args: started.append(args))
    with pytest.raises(SystemExit):
        client_check.main([*FLEET, "--", *SHAPE[:-4], "--num-prompts", "7"])  # not a multiple of 4
    assert started == []


def test_the_warm_up_sends_prompts_of_the_runs_length_and_stops_on_a_failure(monkeypatch):
    import asyncio

    from loadtest.micro import bench_tools
    from loadtest.serving import serve_client
    from loadtest.serving.serve_stats import RequestResult

    tools_args = bench_tools.parse_args(
        [*SHAPE, "--url", "http://front", "--out", "/tmp/cc", "--prefill-url", "http://p0"]
    )
    assert client_check.prompt_length(tools_args) == 64 + 16
    sent, in_flight, most = [], [0], [0]

    async def fake(client, url, body):
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        sent.append((url, len(body["prompt"]), body["max_tokens"]))
        return RequestResult(True, len(body["prompt"]))

    monkeypatch.setattr(serve_client, "stream_completion", fake)
    assert asyncio.run(client_check.warm_up("http://front", "m", 80, 8, in_flight=4)) == 8
    assert sent == [("http://front", 80, 4)] * 8 and most[0] == 4

    async def refused(client, url, body):
        return RequestResult(False, 0, error="HTTP 503: busy")

    monkeypatch.setattr(serve_client, "stream_completion", refused)
    with pytest.raises(SystemExit, match="8 of 8 warm-up requests failed: HTTP 503"):
        asyncio.run(client_check.warm_up("http://front", "m", 80, 8))
