"""Conditional disaggregation's decisions rebuilt from fleet records: the tenant LRU's hits,
the legs in flight, the queue rule on the rebuilt state, on small synthetic records."""

from __future__ import annotations

import gzip
import json

from loadtest.serving.fleet_cond import (
    LOCAL,
    TenantLru,
    decisions,
    estimate_uncached,
    in_flight,
    main,
    requests,
    rule,
)

P0, P1 = "http://127.0.0.1:8100", "http://127.0.0.1:8101"
D0, D1 = "http://127.0.0.1:8200", "http://127.0.0.1:8201"
PROMPT, CONTEXT = 4352, 4096
HIT = PROMPT - (CONTEXT - 16)  # what a worker holding the tenant lacks: 272


def rec(i, sent, prefill_ms, ttft, done, dw, pw, group, phase="level-5", route_ms=0.0):
    return {
        "id": i,
        "phase": phase,
        "group": group,
        "prompt_tokens": PROMPT,
        "sent_s": sent,
        "done_s": done,
        "ok": True,
        "ttft_s": ttft,
        "tpot_s": 0.05,
        "phases_ms": {"route": route_ms, "prefill": 0.0 if pw == LOCAL else prefill_ms},
        "served_by": {"prefill": pw, "decode": dw},
    }


def test_the_tenant_lru_forgets_the_least_recently_stored():
    lru = TenantLru(2)
    lru.store(1)
    lru.store(2)
    lru.store(1)  # 1 is now the most recent
    lru.store(3)
    assert lru.holds(1) and lru.holds(3) and not lru.holds(2)


def test_a_tenant_hits_only_the_worker_that_stored_it_and_pushed_kv_is_stored_on_the_decode_worker():
    reqs = requests(
        [
            rec(0, 0.0, 100, 0.3, 1.0, D0, P0, group=7),
            rec(1, 2.0, 100, 0.3, 3.0, D1, P0, group=7),  # P0 holds 7; D1 does not
            rec(2, 4.0, 100, 0.3, 5.0, D0, P1, group=7),  # P1 does not; D0 does (pushed by request 0)
            rec(3, 6.0, 0, 0.3, 7.0, D0, LOCAL, group=7),
        ]
    )
    hits = estimate_uncached(reqs, lru_tenants=7, context=CONTEXT)
    assert [q.pw_uncached for q in reqs] == [PROMPT, HIT, PROMPT, 0]
    assert [q.dw_uncached for q in reqs] == [PROMPT, PROMPT, HIT, HIT]
    assert hits["level-5 " + P0] == [0, 1] and hits["level-5 " + D0] == [0, 1, 1]
    assert reqs[2].extra["held_by"] == {P0, D0, D1}


def test_a_tenant_evicted_by_others_misses_again():
    rows = [rec(i, float(i), 100, 0.3, i + 0.5, D0, P0, group=g) for i, g in enumerate([1, 2, 3, 1])]
    reqs = requests(rows)
    estimate_uncached(reqs, lru_tenants=2, context=CONTEXT)
    assert reqs[-1].pw_uncached == PROMPT
    estimate_uncached(reqs, lru_tenants=3, context=CONTEXT)
    assert reqs[-1].pw_uncached == HIT


def test_legs_in_flight_are_counted_over_their_leases():
    reqs = requests(
        [
            rec(0, 0.0, 500, 1.0, 3.0, D0, P0, group=1),  # prefill leg 0-0.5, KV held 0.5-3, decoding 1-3
            rec(1, 0.2, 0, 0.8, 2.0, D0, LOCAL, group=2),  # local lease 0.2-0.8, KV held 0.2-2
        ]
    )
    estimate_uncached(reqs, lru_tenants=7, context=CONTEXT)
    s = in_flight(reqs, 0.3)
    assert s[P0]["legs"] == 1 and s[P0]["pending"] == PROMPT
    assert s[D0]["local"] == 1 and s[D0]["local_pending"] == PROMPT and s[D0]["held"] == 1
    s = in_flight(reqs, 1.5)
    assert s[P0]["legs"] == 0 and s[D0]["local"] == 0 and s[D0]["held"] == 2 and s[D0]["decoding"] == 2


def test_the_rule_weighs_the_queues_only_when_every_prefill_worker_is_busy():
    reqs = requests([rec(0, 0.0, 100, 0.3, 1.0, D0, P0, group=1)])
    estimate_uncached(reqs, lru_tenants=7, context=CONTEXT)
    q = reqs[0]
    lacks = {P0: PROMPT, P1: PROMPT}
    busy = {P0: {"legs": 1, "pending": PROMPT}, P1: {"legs": 2, "pending": 2 * PROMPT}, D0: {"local_pending": 0}}
    # 256 + min(4352 + 4352 + 256, ...) = 9216 against 0 + 4352: 4864 > 512.
    assert rule(q, busy, [P0, P1], 512, 256, lacks) == ("prefill_queue", 9216, 0)
    # The decode worker's own local prefills in flight: 9216 - (4352 + 4352) = 512, not more than 512.
    busy[D0] = {"local_pending": PROMPT}
    assert rule(q, busy, [P0, P1], 512, 256, lacks)[0] is None
    assert rule(q, busy, [P0, P1], 511, 256, lacks)[0] == "prefill_queue"
    idle = {P0: {"legs": 0, "pending": 0}, P1: busy[P1], D0: {"local_pending": 0}}
    assert rule(q, idle, [P0, P1], 512, 256, lacks) == (None, None, 0)


def test_a_prompt_the_decode_worker_holds_is_local_whatever_the_queues():
    reqs = requests([rec(0, 0.0, 100, 0.3, 1.0, D0, P0, group=1), rec(1, 2.0, 0, 0.3, 3.0, D0, LOCAL, group=1)])
    estimate_uncached(reqs, lru_tenants=7, context=CONTEXT)
    decisions(reqs, margin=512, load_tokens=256, context=CONTEXT)
    assert reqs[1].extra["reason"] == "cached_on_decode"
    assert reqs[0].extra["reason"] is None and reqs[0].extra["idle_prefill"]


def test_decisions_see_the_legs_of_the_same_phase_only_and_not_the_request_itself():
    rows = [
        rec(0, 0.0, 2000, 2.5, 4.0, D1, P0, group=1),
        rec(1, 0.1, 2000, 2.5, 4.0, D1, P1, group=2),
        rec(2, 0.5, 0, 1.0, 3.0, D0, LOCAL, group=3),  # both prefill workers busy, D0 idle: local
        rec(3, 0.5, 0, 1.0, 3.0, D0, LOCAL, group=4, phase="level-4"),  # the other phase: all idle
    ]
    reqs = requests(rows)
    estimate_uncached(reqs, lru_tenants=7, context=CONTEXT)
    decisions(reqs, margin=512, load_tokens=256, context=CONTEXT)
    by_id = {q.id: q for q in reqs}
    assert by_id[2].extra["reason"] == "prefill_queue"
    assert by_id[2].extra["ahead"] == 256 + PROMPT + PROMPT + 256
    assert by_id[3].extra["reason"] is None
    assert by_id[0].extra["reason"] is None  # it arrived to idle prefill workers


def test_main_prints_the_tables(tmp_path, capsys):
    path = tmp_path / "requests-sc3x-kv_aware_conditional.jsonl.gz"
    rows = [
        rec(0, 0.0, 2000, 2.5, 4.0, D1, P0, group=1),
        rec(1, 0.1, 2000, 2.5, 4.0, D1, P1, group=2),
        rec(2, 0.5, 0, 1.0, 3.0, D0, LOCAL, group=3),
    ]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    main([str(path), "--phases", "level-5"])
    out = capsys.readouterr().out
    assert "## sc3x kv_aware_conditional (r1)" in out
    assert "| level-5 | 3 | 1 | 1 (0 / 1) | 3/3 |" in out
    assert "| 8200 | 1 (1) | 4.4 | 1 |" in out
