"""Where a request decodes (proxy/flow/disagg.py, `_decode_attempts`): a leg with KV is
picked by the decode pool's policy when it leaves, on the loads then, even where cache-aware
routing made a route plan at arrival; conditional disaggregation's planned decode worker
binds a prompt it prefills itself, and any leg of a pool whose policy reads no load
(round_robin), which takes one turn a request either way. Against stand-in workers."""

import threading

import httpx
import pytest

from tests.harness import merged, wait_for
from tests.proxy_cluster import PAIRED_INFO as INFO
from tests.proxy_cluster import Fleet
from tests.standin import decode_legs

# kv_aware on the prefill pool plans a route (its decode worker included) at arrival;
# least_outstanding on the decode pool, as the fleet benchmark's kv_aware_prefill ran.
KV_AWARE_PREFILL = {
    "routing": {"prefill_policy": "kv_aware", "decode_policy": "least_outstanding"},
    "health": {"interval_s": 0.05},
}


def complete(fleet: Fleet, prompt: str) -> None:
    body = {"model": "m", "prompt": prompt, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", fleet.url + "/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        for _ in response.iter_lines():
            pass


def test_a_burst_planned_before_any_hand_off_spreads_over_the_decode_workers():
    """Four prompts arrive while the first is still prefilling, so every route plan sees two
    idle decode workers (picked at arrival, they fell on one worker as often as the
    tie-breaks did: the fleet benchmark's tail). Each hand-off sees the legs already open
    (each stays open 1.5 s): least_outstanding's two candidates are both workers, the one
    with fewer legs wins, so they split 2 and 2 whatever the tie-breaks."""
    with Fleet(1, 2, INFO, **KV_AWARE_PREFILL) as fleet:
        fleet.prefills[0].delay_s = 2.0  # wide windows: a loaded machine still plans all four first
        for decode in fleet.decodes:
            decode.stream_event_delay_s = 0.5
        prefill = fleet.app.state.pools[0].workers[0]
        threads = []
        for i in range(4):
            threads.append(threading.Thread(target=complete, args=(fleet, f"prompt {i}: " + "x" * 40)))
            threads[-1].start()
            assert wait_for(lambda n=i + 1: prefill.outstanding == n, 5)  # planned, prefilling
        assert sum(len(decode_legs(d)) for d in fleet.decodes) == 0  # no hand-off before the last plan
        for thread in threads:
            thread.join(30)
        assert sorted(len(decode_legs(d)) for d in fleet.decodes) == [2, 2]


@pytest.mark.parametrize(
    "routing, local",
    [
        ({}, False),  # a route plan (kv_aware prefill pool), no conditional: picked at the hand-off only
        ({"disaggregation": "conditional", "local_prefill_max_tokens": 4096}, True),  # planned, prefilled there
        ({"disaggregation": "conditional", "local_prefill_max_tokens": 8}, False),  # planned, disaggregated
    ],
)
def test_round_robin_takes_one_turn_a_request_wherever_the_worker_is_picked(routing, local):
    """Six prompts one after another over two decode workers on round_robin split 3 and 3:
    a request that took a turn at its plan and another at its hand-off would land on the
    same worker every time. With conditional disaggregation the planned worker serves the
    prompt, prefilling it itself (no prefill leg, no KV) or given the KV."""
    settings = merged(KV_AWARE_PREFILL, {"routing": {"decode_policy": "round_robin", **routing}})
    with Fleet(1, 2, INFO, **settings) as fleet:
        for i in range(6):
            complete(fleet, f"prompt {i}: " + "x" * 40)
        assert [len(decode_legs(d)) for d in fleet.decodes] == [3, 3]
        without_kv = [legs.get("kv_transfer_params") is None for d in fleet.decodes for legs in decode_legs(d)]
        assert without_kv == [local] * 6
        assert (fleet.prefills[0].received == []) == local
