"""loadtest/serving/dp_vote.py against a stand-in prefill worker: one prefill request in flight at
a time, counter deltas read from /metrics around them, and the report."""

import json

import pytest
from fastapi import FastAPI, Request
from starlette.responses import PlainTextResponse

from loadtest.serving import dp_vote
from tests.standin import ThreadServer


def standin_worker():
    app = FastAPI()
    state = {"steps": 0, "inflight": 0, "max_inflight": 0, "bodies": []}

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "m"}]}

    @app.post("/v1/completions")
    async def complete(request: Request):
        state["inflight"] += 1
        state["max_inflight"] = max(state["max_inflight"], state["inflight"])
        state["bodies"].append(await request.json())
        state["steps"] += 2  # two chunks a prompt; the runner drafted in one of them
        state["inflight"] -= 1
        return {"choices": [{"text": "x"}]}

    @app.get("/metrics")
    async def metrics():
        s = state["steps"]
        return PlainTextResponse(
            f"pdspec_proposals_total {s}\npdspec_k0_proposals_total {s}\n"
            f"pdspec_runner_proposals_total {s}\npdspec_runner_k0_proposals_total {s // 2}\n"
            "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        )

    return app, state


def test_prefill_requests_one_at_a_time_and_counter_deltas(tmp_path):
    app, state = standin_worker()
    with ThreadServer(app) as server:
        dp_vote.main(["--worker", f"a={server.url}", "--requests", "3", "--prompt-tokens", "8", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "dp_vote.json").read_text())["a"]
    assert state["max_inflight"] == 1 and len(state["bodies"]) == 3
    assert all(b["max_tokens"] == 1 and len(b["prompt"]) == 8 for b in state["bodies"])
    assert result["pdspec_k0_proposals_total"] == 6 and result["pdspec_runner_k0_proposals_total"] == 3
    assert "| a | 3 | 6 | 6 | 6 | 3 |" in (tmp_path / "dp_vote.md").read_text()


def test_combine_merges_arms_measured_apart(tmp_path):
    for name, k0 in (("vote", 32), ("no-vote", 0)):
        (tmp_path / name).mkdir()
        counts = {c: 32.0 for c in dp_vote.COUNTERS} | {dp_vote.RUNNER_K0_PROPOSALS: float(k0)}
        (tmp_path / name / "dp_vote.json").write_text(json.dumps({name: {"url": "u", "requests": 16, **counts}}))
    out = tmp_path / "both"
    dp_vote.main(["--combine", str(tmp_path / "vote"), str(tmp_path / "no-vote"), "--out", str(out)])
    merged = json.loads((out / "dp_vote.json").read_text())
    assert list(merged) == ["vote", "no-vote"]
    table = (out / "dp_vote.md").read_text()
    assert "| vote | 16 | 32 | 32 | 32 | 32 |" in table and "| no-vote | 16 | 32 | 32 | 32 | 0 |" in table
    assert (out / "dp_vote.png").read_bytes().startswith(b"\x89PNG")


def test_combine_leaves_out_an_arm_that_wrote_nothing_and_refuses_a_name_twice(tmp_path, capsys):
    (tmp_path / "vote").mkdir()
    counts = {c: 4.0 for c in dp_vote.COUNTERS}
    (tmp_path / "vote" / "dp_vote.json").write_text(json.dumps({"vote": {"url": "u", "requests": 2, **counts}}))
    assert list(dp_vote.combine([tmp_path / "vote", tmp_path / "no-vote"])) == ["vote"]
    assert "no-vote/dp_vote.json: missing" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="'vote' is already in another folder"):
        dp_vote.combine([tmp_path / "vote", tmp_path / "vote"])


def test_combine_takes_no_worker(tmp_path):
    with pytest.raises(SystemExit):
        dp_vote.main(["--combine", str(tmp_path), "--worker", "a=http://127.0.0.1:9", "--out", str(tmp_path)])
    assert not (tmp_path / "dp_vote.json").exists()
