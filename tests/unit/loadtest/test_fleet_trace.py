"""The fleet benchmark's traces: seeded, their shape as asked, the same after a round trip to disk."""

from __future__ import annotations

import pytest

from loadtest.serving.fleet_trace import (
    FIRST_TOKEN_ID,
    multi_turn,
    parse_levels,
    read_trace,
    shared_context,
    write_trace,
)


def small_shared(seed: int = 7, system: int = 0):
    return shared_context(
        seed,
        tenants=5,
        context=64,
        question=8,
        max_tokens=4,
        levels=[(2.0, 5.0), (6.0, 3.0)],
        warmup_requests=4,
        warmup_qps=4.0,
        vocab=500,
        system=system,
    )


def test_shared_context_has_the_asked_shape():
    trace = small_shared(system=16)
    assert trace.phases() == ["warmup", "level-0", "level-1"] and trace.levels == [2.0, 6.0]
    warmup = trace.phase("warmup")
    assert len(warmup) == 4 and [r.at_s for r in warmup] == [0.0, 0.25, 0.5, 0.75]
    for request in trace.requests:
        prompt = trace.prompt(request)
        assert len(prompt) == 16 + 64 + 8 and request.max_tokens == 4
        assert all(FIRST_TOKEN_ID <= t < 500 for t in prompt)
        # The common prefix, then the tenant's own context, then a query of its own.
        assert prompt[:16] == trace.segments["system"]
        assert prompt[16:80] == trace.segments[f"ctx/{request.group}"]
    level = trace.phase("level-0")
    times = [r.at_s for r in level]
    assert times == sorted(times) and all(0 <= t < 5.0 for t in times)
    assert {r.qps for r in level} == {2.0}
    queries = [tuple(trace.prompt(r)[80:]) for r in trace.requests]
    assert len(set(queries)) == len(queries)  # every query is new


def test_poisson_levels_have_about_the_asked_rate():
    trace = shared_context(
        3,
        tenants=4,
        context=16,
        question=4,
        max_tokens=2,
        levels=[(10.0, 200.0)],
        warmup_requests=0,
        warmup_qps=1.0,
        vocab=100,
    )
    assert trace.phases() == ["level-0"]
    assert 1800 <= len(trace.requests) <= 2200  # 2,000 expected; a Poisson count's spread is about 45
    tenants = [r.group for r in trace.requests]
    assert all(tenants.count(t) > 400 for t in range(4))  # drawn uniformly


def test_same_seed_same_trace_other_seed_other_trace():
    assert small_shared(7).requests == small_shared(7).requests
    assert small_shared(7).segments == small_shared(7).segments
    assert small_shared(7).segments["ctx/0"] != small_shared(8).segments["ctx/0"]


def test_multi_turn_sessions_grow_by_answer_and_message_and_chain_their_turns():
    trace = multi_turn(
        5,
        turns=3,
        start=32,
        answer=8,
        message=4,
        max_tokens=2,
        think_s=0.5,
        levels=[(3.0, 4.0)],
        warmup_sessions=2,
        vocab=300,
    )
    warmup = trace.phase("warmup")
    assert len(warmup) == 2 * 3
    by_session: dict[int, list] = {}
    for request in trace.requests:
        by_session.setdefault(request.group, []).append(request)
    for turns in by_session.values():
        assert [r.turn for r in turns] == [0, 1, 2]
        assert turns[0].after is None and turns[1].after == turns[0].id and turns[2].after == turns[1].id
        lengths = [len(trace.prompt(r)) for r in turns]
        assert lengths == [32, 32 + 12, 32 + 24]
        # Each turn re-sends the one before it whole.
        assert trace.prompt(turns[1])[:32] == trace.prompt(turns[0])
        assert trace.prompt(turns[2])[:44] == trace.prompt(turns[1])
        assert turns[0].think_s == 0.0 and all(r.think_s >= 0 for r in turns)
    level_sessions = {r.group for r in trace.phase("level-0")}
    assert level_sessions and not level_sessions & {r.group for r in warmup}


def test_round_trip_through_disk(tmp_path):
    trace = small_shared()
    trace.name = "sc-small"
    path = tmp_path / "t.json.gz"
    write_trace(trace, path)
    back = read_trace(path)
    assert back.name == "sc-small" and back.workload == "shared_context"
    assert back.requests == trace.requests and back.segments == trace.segments and back.levels == trace.levels
    assert [back.prompt(r) for r in back.requests] == [trace.prompt(r) for r in trace.requests]
    assert back.settings["tenants"] == 5


def test_levels_parse_and_bad_settings_are_refused():
    assert parse_levels("1x8, 2.5x4") == [(1.0, 8.0), (2.5, 4.0)]
    with pytest.raises(ValueError):
        parse_levels("1:8")
    with pytest.raises(ValueError):
        parse_levels("0x8")
    with pytest.raises(ValueError):
        shared_context(1, 0, 64, 8, 4, [(1.0, 1.0)], 0, 1.0, 100)
    with pytest.raises(ValueError):
        multi_turn(1, 0, 32, 8, 4, 2, 0.5, [(1.0, 1.0)], 0, 100)
