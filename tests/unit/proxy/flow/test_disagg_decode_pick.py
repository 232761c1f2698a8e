"""Where a disaggregated request decodes (proxy/flow/disagg.py, `_decode_attempts`): a leg
with KV is picked by the decode pool's policy when it leaves, on the loads then, even when
cache-aware routing planned a decode worker at arrival; only a prompt the planned decode
worker prefills itself (conditional disaggregation) keeps it. Against stand-in workers."""

import threading

import httpx

from tests.harness import merged, wait_for
from tests.proxy_cluster import Fleet
from tests.standin import decode_legs

INFO = {
    "role": "x",
    "model": "/m/t",
    "drafter": "/m/eagle3",
    "method": "eagle3",
    "num_speculative_tokens": "3",
    "block_size": "4",
    "vllm_version": "0.32.0",
    "drafts_policy": "auto",
}
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


def test_a_prompt_planned_to_prefill_on_its_decode_worker_is_served_there_without_kv():
    """Conditional disaggregation with a margin the prompts are under: each goes to its
    planned decode worker as a leg without KV, and no prefill leg is sent."""
    settings = merged(
        KV_AWARE_PREFILL, {"routing": {"disaggregation": "conditional", "local_prefill_max_tokens": 4096}}
    )
    with Fleet(1, 2, INFO, **settings) as fleet:
        for i in range(6):
            complete(fleet, f"short {i}")
        assert sum(len(decode_legs(d)) for d in fleet.decodes) == 6
        assert all(legs.get("kv_transfer_params") is None for d in fleet.decodes for legs in decode_legs(d))
        assert fleet.prefills[0].received == []
