"""decode_full (proxy/flow/disagg.py, proxy/routing/plan.py's `decode_full_on`): under
conditional disaggregation, a request no decode worker has KV room for is served whole by a
prefill worker with room (one leg without KV params, no prefill leg, no hand-off), leased
there as a decode leg; should that leg fail before its reply begins, the decode pool serves
it as a decode-only request. Against stand-in workers, which export their KV size on
/metrics (`kv_size_tokens`) and count the prompt's bytes as its tokens."""

import json
import threading

import httpx
import pytest

from tests.harness import wait_for
from tests.proxy_cluster import PAIRED_INFO as INFO
from tests.proxy_cluster import Fleet, sample
from tests.standin import decode_legs, prefill_legs

PROMPT = "x" * 40  # 40 tokens: more than the decode worker's KV below, longer than the local prefill rule's 8
SETTINGS = {
    # kv_aware on the prefill pool, whose score reads the prefill work a whole request leases.
    "routing": {"disaggregation": "conditional", "local_prefill_max_tokens": 8, "prefill_policy": "kv_aware"},
    "health": {"interval_s": 0.05},
    "retries": {"backoff_s": 0.01},
    "observability": {"served_by_headers": True},
}


def full_fleet(decode_kv_tokens: int = 16, **settings) -> Fleet:
    """Two prefill stand-ins, the first with room for any prompt here, the second of no known
    KV size (so never chosen), and one decode stand-in of `decode_kv_tokens` of KV."""
    fleet = Fleet(2, 1, INFO, SETTINGS, **settings)
    fleet.prefills[0].kv_size_tokens = 16_000
    fleet.decodes[0].kv_size_tokens = decode_kv_tokens
    return fleet


def sized(fleet: Fleet) -> bool:
    """Whether the proxy has read the KV sizes (its first health round)."""
    prefill, decode = fleet.app.state.pools
    return prefill.workers[0].kv_tokens is not None and decode.workers[0].kv_tokens is not None


def counts(fleet: Fleet) -> list[tuple[int, int, int, int]]:
    """Every worker's leased counts (outstanding, pending, local prefill, KV held), prefill pool first."""
    return [
        (w.outstanding, w.pending_tokens, w.local_prefill_tokens, w.kv_held_tokens)
        for pool in fleet.app.state.pools
        for w in pool.workers
    ]


def idle(fleet: Fleet) -> bool:
    return all(c == (0, 0, 0, 0) for c in counts(fleet))


def decode_full_count(fleet: Fleet) -> float | None:
    return sample(httpx.get(fleet.url + "/metrics").text, 'pdspec_proxy_local_prefills_total{reason="decode_full"}')


def server_timing(response: httpx.Response) -> dict[str, float]:
    parts = [part.strip().split(";dur=") for part in response.headers["server-timing"].split(",")]
    return {name: float(ms) for name, ms in parts}


def body(stream: bool) -> dict:
    return {"model": "m", "prompt": PROMPT, "max_tokens": 3, "stream": stream}


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_the_decode_worker_has_no_room_for_is_served_whole_by_a_prefill_worker(stream):
    with full_fleet() as fleet:
        assert wait_for(lambda: sized(fleet), 5, poll_s=0.02)
        with httpx.stream("POST", fleet.url + "/v1/completions", json=body(stream), timeout=30) as response:
            text = response.read().decode()
        assert response.status_code == 200, text
        if stream:
            assert text.startswith("data: ") and "data: [DONE]" in text
        else:
            assert json.loads(text)["choices"]
        whole = fleet.servers[0].url
        assert response.headers["x-pdspec-decode-worker"] == whole
        assert response.headers["x-pdspec-prefill-worker"] == "local"
        assert server_timing(response)["prefill"] < 5  # ms: there was none
        served = fleet.prefills[0]
        assert [leg.get("kv_transfer_params") for leg in decode_legs(served)] == [None]  # one leg, without KV
        assert prefill_legs(served) == [] and fleet.prefills[1].received == []
        assert decode_legs(fleet.decodes[0]) == []  # the decode worker served nothing (it tokenized the prompt)
        assert decode_full_count(fleet) == 1
        assert wait_for(lambda: idle(fleet), 5, poll_s=0.02), counts(fleet)


def test_while_it_runs_the_whole_request_leases_its_kv_and_until_its_first_token_its_prefill():
    """On the prefill worker it serves: one leg, the prompt's 40 tokens held in its KV all
    along, and as kv_aware's prefill work (pending) only until its first token."""
    with full_fleet() as fleet:
        assert wait_for(lambda: sized(fleet), 5, poll_s=0.02)
        served, worker = fleet.prefills[0], fleet.app.state.pools[0].workers[0]
        served.delay_s = 1.0  # before its reply's headers: prefilling
        served.stream_event_delay_s = 0.3
        before_first_token = []
        watcher = threading.Thread(
            target=lambda: before_first_token.append(
                wait_for(lambda: (worker.outstanding, worker.pending_tokens, worker.kv_held_tokens) == (1, 40, 40), 5)
            )
        )
        watcher.start()
        streaming = []
        with httpx.stream("POST", fleet.url + "/v1/completions", json=body(True), timeout=30) as response:
            assert response.status_code == 200
            for _ in response.iter_lines():
                streaming.append((worker.outstanding, worker.pending_tokens, worker.kv_held_tokens))
        watcher.join(5)
        assert before_first_token == [True]
        assert streaming[0] == (1, 0, 40)  # decoding: its prefill no longer ahead of other prompts
        assert wait_for(lambda: idle(fleet), 5, poll_s=0.02), counts(fleet)


def test_a_client_gone_mid_stream_ends_the_whole_leg_and_its_leases():
    with full_fleet() as fleet:
        assert wait_for(lambda: sized(fleet), 5, poll_s=0.02)
        fleet.prefills[0].stream_event_delay_s = 1.0  # a long generation
        with httpx.stream("POST", fleet.url + "/v1/completions", json=body(True), timeout=30) as response:
            assert response.status_code == 200
            next(response.iter_lines())
        assert wait_for(lambda: fleet.prefills[0].streams_abandoned == 1, 10, poll_s=0.02)
        assert wait_for(lambda: idle(fleet), 5, poll_s=0.02), counts(fleet)


@pytest.mark.parametrize("stream", [False, True])
def test_a_whole_leg_that_fails_before_its_reply_falls_back_to_the_decode_pool(stream):
    """The prefill worker answers 503: the decode worker serves the request as a decode-only
    one (no prefill leg, no KV; it prefills the prompt itself), and no lease is left."""
    with full_fleet() as fleet:
        assert wait_for(lambda: sized(fleet), 5, poll_s=0.02)
        fleet.prefills[0].fail_decodes = 1
        with httpx.stream("POST", fleet.url + "/v1/completions", json=body(stream), timeout=30) as response:
            response.read()
        assert response.status_code == 200
        assert response.headers["x-pdspec-decode-worker"] == fleet.servers[2].url
        assert len(decode_legs(fleet.prefills[0])) == 1  # the failed whole leg
        assert [leg.get("kv_transfer_params") for leg in decode_legs(fleet.decodes[0])] == [None]
        assert all(prefill_legs(b) == [] for b in fleet.prefills)
        metrics = httpx.get(fleet.url + "/metrics").text
        assert sample(metrics, 'pdspec_proxy_leg_failures_total{leg="decode",reason="http_503"}') == 1
        assert wait_for(lambda: idle(fleet), 5, poll_s=0.02), counts(fleet)


def test_a_worker_4xx_on_the_whole_leg_goes_back_to_the_client():
    with full_fleet() as fleet:
        assert wait_for(lambda: sized(fleet), 5, poll_s=0.02)
        fleet.prefills[0].fail_decodes, fleet.prefills[0].fail_status = 1, 400
        response = httpx.post(fleet.url + "/v1/completions", json=body(False), timeout=30)
        assert response.status_code == 400
        assert decode_legs(fleet.decodes[0]) == []  # the request's fault: not tried elsewhere
        assert wait_for(lambda: idle(fleet), 5, poll_s=0.02), counts(fleet)


@pytest.mark.parametrize(
    "decode_kv_tokens, routing",
    [
        (16_000, {}),  # the decode worker has room: disaggregated as before
        (16, {"decode_on_prefill_when_full": False}),
    ],
)
def test_otherwise_the_request_is_disaggregated(decode_kv_tokens, routing):
    with full_fleet(decode_kv_tokens, routing=routing) as fleet:
        assert wait_for(lambda: sized(fleet), 5, poll_s=0.02)
        response = httpx.post(fleet.url + "/v1/completions", json=body(False), timeout=30)
        assert response.status_code == 200
        assert response.headers["x-pdspec-decode-worker"] == fleet.servers[2].url
        assert response.headers["x-pdspec-prefill-worker"] != "local"
        assert sum(len(prefill_legs(b)) for b in fleet.prefills) == 1
        assert decode_full_count(fleet) == 0
        assert wait_for(lambda: idle(fleet), 5, poll_s=0.02), counts(fleet)
