"""Pending decode KV (proxy/flow/disagg.py, the decode pool's `decode_pending_tokens`): under
conditional disaggregation a request its plan disaggregates counts its prompt against the
decode pool from its plan until its decode leg leases a decode worker's KV, or until it ends
any other way; with `routing.decode_full_counts_pending`, decode_full reads it, so a burst
planned while earlier requests are still in their prefill legs stops at the decode pool's
room. Against stand-in workers, which export their KV size on /metrics and count the prompt's
bytes as its tokens (tests/unit/proxy/flow/test_disagg_decode_full.py has the fleet)."""

import threading

import httpx
import pytest

from tests.harness import wait_for
from tests.proxy_cluster import PAIRED_INFO as INFO
from tests.proxy_cluster import Fleet, sample
from tests.standin import decode_legs, prefill_legs
from tests.unit.proxy.flow.test_disagg_decode_full import SETTINGS, counts, decode_full_count, idle, sized

PROMPT = "x" * 40  # 40 tokens, longer than the local prefill rule's 8: disaggregated


def fleet(decode_kv_tokens: int = 16_000, *layers: dict, **settings) -> Fleet:
    """Two prefill stand-ins (the first of 16k tokens of KV, the second of unknown size) and
    one decode stand-in of `decode_kv_tokens`; conditional disaggregation, the queue rule off
    (a burst keeping both prefill workers busy would otherwise be prefilled on the decode worker)."""
    fleet = Fleet(2, 1, INFO, SETTINGS, {"routing": {"local_prefill_on_queue": False}}, *layers, **settings)
    fleet.prefills[0].kv_size_tokens = 16_000
    fleet.decodes[0].kv_size_tokens = decode_kv_tokens
    return fleet


def pending(fleet: Fleet) -> int:
    return fleet.app.state.pools[1].decode_pending_tokens


def decode_held(fleet: Fleet) -> int:
    return fleet.app.state.pools[1].workers[0].kv_held_tokens


def gauge(fleet: Fleet) -> float | None:
    return sample(httpx.get(fleet.url + "/metrics").text, "pdspec_proxy_decode_pending_tokens")


def body(prompt: str = PROMPT, **extra) -> dict:
    return {"model": "m", "prompt": prompt, "max_tokens": 3, **extra}


def in_background(fleet: Fleet, request: dict, replies: list, timeout_s: float = 30) -> threading.Thread:
    def send():
        try:
            replies.append(httpx.post(fleet.url + "/v1/completions", json=request, timeout=timeout_s))
        except httpx.TimeoutException as exc:
            replies.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_a_disaggregated_request_is_pending_from_its_plan_until_its_decode_leg_leases_its_kv():
    with fleet() as f:
        assert wait_for(lambda: sized(f), 5, poll_s=0.02)
        for prefill in f.prefills:
            prefill.delay_s = 1.0  # the prefill leg
        f.decodes[0].delay_s = 1.0  # the decode leg, leased before its reply's headers
        replies = []
        thread = in_background(f, body(), replies)
        assert wait_for(lambda: (pending(f), decode_held(f)) == (40, 0), 5, poll_s=0.02), (pending(f), counts(f))
        assert gauge(f) == 40
        assert wait_for(lambda: (pending(f), decode_held(f)) == (0, 40), 5, poll_s=0.02), (pending(f), counts(f))
        assert gauge(f) == 0
        thread.join(10)
        (reply,) = replies
        assert reply.status_code == 200, reply.text
        assert sum(len(prefill_legs(p)) for p in f.prefills) == 1
        assert [leg.get("kv_transfer_params") is not None for leg in decode_legs(f.decodes[0])] == [True]
        assert wait_for(lambda: idle(f), 5, poll_s=0.02), counts(f)
        assert pending(f) == 0


@pytest.mark.parametrize("policy", ["error", "fallback"])
def test_a_failed_prefill_leg_leaves_nothing_pending(policy):
    """error: the request ends with the prefill's 502; fallback: the decode worker serves it
    without KV, and that decode leg's lease takes the prompt off the pending count."""
    with fleet(retries={"prefill_failure_policy": policy}) as f:
        assert wait_for(lambda: sized(f), 5, poll_s=0.02)
        for prefill in f.prefills:
            prefill.delay_s, prefill.fail_prefills = 0.5, 1
        f.decodes[0].delay_s = 1.0
        replies = []
        thread = in_background(f, body(), replies)
        assert wait_for(lambda: pending(f) == 40, 5, poll_s=0.02), counts(f)
        if policy == "fallback":
            assert wait_for(lambda: (pending(f), decode_held(f)) == (0, 40), 5, poll_s=0.02), (pending(f), counts(f))
        thread.join(10)
        (reply,) = replies
        assert reply.status_code == (502 if policy == "error" else 200), reply.text
        assert pending(f) == 0 and gauge(f) == 0
        assert wait_for(lambda: idle(f), 5, poll_s=0.02), counts(f)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_during_the_prefill_leg_leaves_nothing_pending(stream):
    with fleet() as f:
        assert wait_for(lambda: sized(f), 5, poll_s=0.02)
        for prefill in f.prefills:
            prefill.delay_s = 30.0
        replies = []
        thread = in_background(f, body(stream=stream), replies, timeout_s=1.0)
        assert wait_for(lambda: pending(f) == 40, 5, poll_s=0.02), counts(f)
        thread.join(10)
        assert isinstance(replies[0], httpx.ReadTimeout)
        assert wait_for(lambda: sum(p.cancelled for p in f.prefills) == 1, 10, poll_s=0.02)
        assert wait_for(lambda: pending(f) == 0, 5, poll_s=0.02), pending(f)
        assert wait_for(lambda: idle(f), 5, poll_s=0.02), counts(f)
        assert decode_legs(f.decodes[0]) == []


def test_an_early_decode_leg_takes_its_prompt_off_the_pending_count_when_it_leases():
    """Early decode (a prefill worker that pushes): the decode leg is sent, and holds the
    prompt in the decode worker's count, while the prefill leg still runs; it is then no
    longer pending. The first request learns that the worker pushes, the second goes early
    (one prefill worker: the second is ejected, so both go to the one that pushed)."""
    with fleet(16_000, {"kv_transfer": {"early_decode": True}}) as f:
        assert wait_for(lambda: sized(f), 5, poll_s=0.02)
        f.prefills[1].healthy = False
        assert wait_for(lambda: not f.app.state.pools[0].workers[1].healthy, 5, poll_s=0.02)
        f.prefills[0].transfer_mode = "push"
        assert httpx.post(f.url + "/v1/completions", json=body(), timeout=30).status_code == 200
        f.prefills[0].delay_s = 1.5
        replies = []
        thread = in_background(f, body(), replies)
        assert wait_for(lambda: decode_held(f) == 40, 5, poll_s=0.02), counts(f)
        assert f.prefills[0].prefills == 1  # the second prefill leg still runs
        assert pending(f) == 0
        thread.join(10)
        assert replies[0].status_code == 200
        assert decode_legs(f.decodes[0])[-1]["kv_transfer_params"]["remote_block_ids"] == []  # it went early
        assert wait_for(lambda: idle(f), 5, poll_s=0.02), counts(f)
        assert pending(f) == 0


def test_only_a_request_its_plan_disaggregates_is_counted():
    """A short prompt (prefilled on the decode worker) and a beam search (decode-only for its
    own reason, whatever its plan) never count; a long prompt does, once."""
    with fleet() as f:
        assert wait_for(lambda: sized(f), 5, poll_s=0.02)
        pool, counted = f.app.state.pools[1], []
        pend = pool.pend_decode
        pool.pend_decode = lambda tokens: counted.append(tokens) or pend(tokens)
        for request in (body("x" * 6), body(use_beam_search=True, n=2), body()):
            assert httpx.post(f.url + "/v1/completions", json=request, timeout=30).status_code == 200
        assert counted == [40]
        assert pending(f) == 0


@pytest.mark.parametrize("counts_pending", [True, False])
def test_a_burst_past_the_decode_pools_room_sends_the_later_requests_whole_to_a_prefill_worker(counts_pending):
    """A decode worker of 112 tokens of KV, empty by its own count while the burst's prefill
    legs run: two 40-token prompts planned disaggregated (80 pending) leave 32 of room, so the
    third is served whole on the prefill worker with room (decode_full). Without the setting
    all three are disaggregated, and the third would wait at the hand-off for decode KV."""
    with fleet(112, routing={"decode_full_counts_pending": counts_pending}) as f:
        assert wait_for(lambda: sized(f), 5, poll_s=0.02)
        for prefill in f.prefills:
            prefill.delay_s = 1.5
        replies, threads = [], []
        for expected in (40, 80):
            threads.append(in_background(f, body(), replies))
            assert wait_for(lambda expected=expected: pending(f) == expected, 5, poll_s=0.02), counts(f)
        assert decode_held(f) == 0  # none of them decoding yet
        third = httpx.post(
            f.url + "/v1/completions",
            json=body(),
            timeout=30,
        )
        for thread in threads:
            thread.join(10)
        assert third.status_code == 200 and all(r.status_code == 200 for r in replies)
        if counts_pending:
            assert third.headers["x-pdspec-prefill-worker"] == "local"
            assert third.headers["x-pdspec-decode-worker"] == f.servers[0].url
            assert decode_full_count(f) == 1
        else:
            assert third.headers["x-pdspec-prefill-worker"] != "local"
            assert decode_full_count(f) == 0
        assert all(r.headers["x-pdspec-prefill-worker"] != "local" for r in replies)
        assert len(decode_legs(f.decodes[0])) == (2 if counts_pending else 3)
        assert wait_for(lambda: idle(f), 5, poll_s=0.02), counts(f)
        assert pending(f) == 0
