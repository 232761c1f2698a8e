"""The fleet tail analysis: decode legs open at a hand-off, clumps of hand-offs, and which
worker a pick favoured, on small synthetic records."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from loadtest.serving.fleet_tail import (
    close_pairs,
    clump,
    label,
    main,
    open_legs,
    phase_stats,
    pick_to_least,
    timeline,
)

A, B = "http://127.0.0.1:8200", "http://127.0.0.1:8201"


def rec(i, sent, prefill_ms, ttft, done, dw, pw="http://127.0.0.1:8100", group=0, route_ms=0.0, phase="level-4"):
    return {
        "id": i,
        "phase": phase,
        "group": group,
        "sent_s": sent,
        "done_s": done,
        "ok": True,
        "output_tokens": 48,
        "ttft_s": ttft,
        "tpot_s": 0.04,
        "phases_ms": {"route": route_ms, "prefill": prefill_ms, "decode": 3.0},
        "served_by": {"prefill": pw, "decode": dw},
    }


def test_timeline_times_and_requests_without_server_timing_left_out():
    (r,) = timeline(
        [
            rec(0, 1.0, 500.0, 0.8, 3.0, A, route_ms=100.0),
            {**rec(1, 1.0, 0, 0.5, 2.0, A), "phases_ms": {}},  # vLLM's router
            {**rec(2, 1.0, 10, 0.5, 2.0, A), "ok": False},
        ]
    )
    assert r["arrive"] == pytest.approx(1.1) and r["handoff"] == pytest.approx(1.6)
    assert r["first"] == pytest.approx(1.8) and r["post"] == pytest.approx(0.2) and r["end"] == 3.0


def test_open_legs_count_from_hand_off_to_end_and_waiting_until_first_token():
    reqs = timeline(
        [
            rec(0, 0.0, 1000, 1.5, 3.0, A),  # open on A over [1.0, 3.0), waiting over [1.0, 1.5)
            rec(1, 0.0, 2000, 2.1, 4.0, A),  # open on A over [2.0, 4.0)
            rec(2, 0.0, 500, 0.6, 5.0, B),
        ]
    )
    assert [open_legs(reqs, A, t) for t in (0.99, 1.0, 1.4, 2.0, 3.0, 4.0)] == [0, 1, 1, 2, 1, 0]
    assert [open_legs(reqs, A, t, waiting=True) for t in (1.0, 1.5, 2.05, 2.1)] == [1, 0, 1, 0]
    assert open_legs(reqs, A, 2.5, skip=reqs[1]) == 1
    assert open_legs(reqs, B, 2.5) == 1


def test_clumps_count_other_hand_offs_within_the_window():
    reqs = timeline(
        [
            rec(0, 0.0, 1000, 1.2, 3.0, A, group=1),
            rec(1, 0.0, 1050, 1.2, 3.0, A, group=2),  # 50 ms later, same worker
            rec(2, 0.0, 1090, 1.2, 3.0, B, group=1),  # 90 ms after 0, other worker
            rec(3, 0.0, 1220, 1.5, 3.0, A, group=3),  # 130-220 ms after the others: no clump
        ]
    )
    assert [clump(reqs, r, 0.1) for r in reqs] == [1, 1, 0, 0]
    assert [clump(reqs, r, 0.1, same_worker=False) for r in reqs] == [2, 2, 2, 0]
    assert close_pairs(reqs, 0.1) == (3, 1, 3, 1)  # pairs (0,1) (0,2) (1,2): one same tenant, one same decode


def test_a_pick_made_at_arrival_on_stale_counts_shows_at_hand_off():
    # A has one leg open, B none, when a burst of three arrives (0.5-0.7 s); picked at
    # arrival, all three go to B (they count on B only from their hand-off at 1.5 s), where
    # each then meets the other two: the least loaded at arrival, the busier at hand-off.
    reqs = timeline(
        [
            rec(0, 0.0, 100, 0.2, 5.0, A),  # open on A over [0.1, 5.0)
            rec(1, 0.0, 100, 0.2, 0.45, B),  # open on B over [0.1, 0.45)
            rec(2, 0.5, 1000, 1.1, 4.0, B),
            rec(3, 0.6, 900, 1.0, 4.0, B),
            rec(4, 0.7, 800, 1.0, 4.0, B),
        ]
    )
    assert pick_to_least(reqs[2:], [A, B], "arrive") == (0, 0)  # alone, the burst meets only ties
    # At arrival: requests 0 and 1 tie (nothing open at 0.0); the burst finds A 1, B 0.
    assert pick_to_least(reqs, [A, B], "arrive") == (3, 3)
    # At hand-off: 0 and 1 (both at 0.1) each find the other's worker 1, their own 0 (least);
    # each burst leg finds A 1, B 2 (the other two burst legs).
    assert pick_to_least(reqs, [A, B], "handoff") == (2, 5)


def test_phase_stats_open_and_waiting_legs_at_each_hand_off():
    stats = phase_stats(
        [
            rec(0, 0.0, 100, 0.2, 5.0, A),  # hand-off 0.1, first token 0.2
            rec(1, 0.0, 200, 0.5, 5.0, A),  # hand-off 0.2, first token 0.5
            rec(2, 0.0, 300, 2.0, 5.0, A),  # hand-off 0.3: meets 0 (running) and 1 (waiting)
        ],
        0.1,
    )
    assert stats["n"] == 3 and stats["open"] == (1.0, 2)  # 0, 1 and 2 legs open
    assert stats["waiting"] == pytest.approx(1 / 3)  # only request 2 meets one still waiting
    assert stats["least_handoff"] == (0, 0) and stats["imbalance"] == 0  # one decode worker: no choice
    assert stats["post"][0] == pytest.approx(300.0)  # posts 100, 300, 1,700 ms


def test_a_request_handed_to_the_busier_worker_is_flagged():
    stats = phase_stats(
        [
            rec(0, 0.0, 100, 0.2, 5.0, A),  # hand-off 0.1 with request 1: each meets the other on A
            rec(1, 0.0, 100, 0.2, 5.0, A),
            rec(2, 0.0, 1000, 3.0, 5.0, A),  # at 1.0: A holds 0 and 1, B holds 3; post 2.0 s
            rec(3, 0.0, 1000, 1.2, 5.0, B),  # at 1.0: B holds none; post 0.2 s
        ],
        0.1,
    )
    (busier_p90, rest_p90), n_busier = stats["post_busier"]
    assert n_busier == 3 and rest_p90 == pytest.approx(200.0)
    assert busier_p90 == pytest.approx(1620.0)  # p90 of 100, 100, 2,000 ms
    assert stats["least_handoff"] == (1, 4)
    assert stats["dshare"] == 0.75


def test_label_and_main_print_one_row_per_phase(tmp_path: Path, capsys):
    path = tmp_path / "call-e" / "requests-sc1x-kv_aware_prefill.jsonl.gz"
    path.parent.mkdir()
    with gzip.open(path, "wt") as f:
        for r in [
            rec(0, 0.0, 100, 0.2, 2.0, A),
            rec(1, 0.1, 100, 0.3, 2.0, B),
            rec(2, 0.0, 50, 0.1, 1.0, A, phase="warmup"),
        ]:
            f.write(json.dumps(r) + "\n")
    assert label(path) == ("sc1x", "kv_aware_prefill", "call-e")
    assert label(Path("requests-mt-round_robin.jsonl.gz")) == ("mt", "round_robin", "r1")
    main([str(path), "--phases", "level-4,level-9"])
    out = capsys.readouterr().out
    assert out.count("| sc1x | kv_aware_prefill | call-e | level-4 | 2 |") == 3  # one row in each table
    assert "level-9" not in out and "warmup" not in out
    main([str(path), "--phases", "level-4", "--timeline"])
    out = capsys.readouterr().out  # request 1 meets request 0 open on 8200 at its arrival and hand-off
    assert "| 0.10 | 0.20 | 1(1) 0(0) | 1(0) 0(0) | 8201 | 0 | 200 |" in out  # 0 waits until 0.2
