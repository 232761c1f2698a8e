"""Cache-aware routing with real workers (2 prefill, 1 decode, vLLM's KV events over ZMQ,
KV over NIXL), on the proxy's own token ids (`routing.tokenizer`, as `pdspec up` sets it;
its start-up check against the decode worker's /tokenize passed, no round trip):
requests sharing a long prefix land on the prefill worker that holds it, as its own
prefix-cache counter shows; the decode worker's events report the blocks it
received over NIXL; a short follow-up turn is prefilled on the decode worker holding the
conversation, with the same output as the disaggregated path; a holder that dies, or
restarts in place, gets no cache-affine traffic until its new events say it holds the
context again."""

import json
import time

import httpx
import pytest

from deploy.prometheus.promql import load_dashboard, panel_queries, substitute
from tests import harness
from tests.prometheus_server import PrometheusServer
from tests.standin import unused_port

pytestmark = pytest.mark.after_stack  # three workers: not beside the shared stack

BASE = 19500  # this module's two proxies; the workers are the shared fleet's (tests/fleet.py)
CONTEXT = "".join(f"def helper_{i}(value):\n    return value * {i} + {i % 7}\n\n" for i in range(40))
# The local model's tokenizer makes CONTEXT about 720 tokens: 5 KV blocks of 128 on the CPU.
# A follow-up turn adds about 110 uncached tokens (under local_prefill_max_tokens: prefilled
# on the decode worker); a question repeated 12 times adds about 220 (disaggregated).
QUESTIONS = [
    "# What does helper_3 return?\n",
    "# Which helper is the largest?\n",
    "# Rewrite helper_5.\n",
    "# Is helper_9 pure?\n",
]
ROUTING = {
    "routing": {
        "prefill_policy": "kv_aware",
        "decode_policy": "kv_aware",
        "disaggregation": "conditional",
        "local_prefill_max_tokens": 160,
        "tokenizer": str(harness.models_dir() / "target"),  # the model the fleet serves
    },
    "observability": {"served_by_headers": True},
}


@pytest.fixture(scope="module")
def fleet(fleet_2p1d):
    """The shared 2P1D fleet (tests/fleet.py) behind this module's two proxies."""
    common = {
        "prefill_urls": fleet_2p1d.prefill_urls,
        "decode_urls": fleet_2p1d.decode_urls,
        "health": {"interval_s": 0.5},
        "kv_transfer": {"source_ports": fleet_2p1d.kv_source_ports},
        "worker_client": {"prefill_timeout_s": 60, "decode_timeout_s": 120},
    }
    routed = harness.start_proxy(BASE, **common, **ROUTING)
    # The reference: every request disaggregated, routed by the prompt's hash.
    plain = harness.start_proxy(BASE + 1, **common, routing={"prefill_policy": "prefix_affinity"})
    # decode_full: the decode worker judged full at a millionth of its KV (a fraction of a
    # token), so every prompt it would not prefill itself goes whole to a prefill worker.
    spill = harness.start_proxy(
        BASE + 2, **common, **{**ROUTING, "routing": {**ROUTING["routing"], "decode_full_share": 1e-6}}
    )
    servers = {"routed": routed, "plain": plain, "spill": spill, "shared": fleet_2p1d, **fleet_2p1d.servers}
    try:
        for proxy in (routed, plain, spill):
            harness.wait_healthy(proxy.url, proxy.process, path="/ready")
        # The proxy's tokenizer agreed with the decode worker's /tokenize: it tokenizes itself.
        wait_for(lambda: tokenizer_agrees(routed.url) == {"text": 1.0, "chat": 1.0}, "the tokenizer check")
        yield servers  # a test that restarts a worker puts the new one here (and in the shared fleet)
    finally:
        routed.stop()
        plain.stop()
        spill.stop()


def complete(proxy: str, prompt: str, client: httpx.Client) -> httpx.Response:
    response = client.post(
        proxy + "/v1/completions", json={"model": "pdspec-tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    )
    assert response.status_code == 200, response.text
    return response


def tokenizer_agrees(proxy: str) -> dict[str, float]:
    return {
        dict(labels)["kind"]: v for labels, v in harness.scrape_labeled(proxy, "pdspec_proxy_tokenizer_agrees").items()
    }


def token_id_sources(proxy: str) -> dict[str, float]:
    return {
        dict(labels)["source"]: v
        for labels, v in harness.scrape_labeled(proxy, "pdspec_proxy_prompt_token_ids_total").items()
    }


def index_blocks(proxy: str) -> dict[str, float]:
    return {
        dict(labels)["worker"]: v for labels, v in harness.scrape_labeled(proxy, "pdspec_proxy_kv_index_blocks").items()
    }


def wait_for(condition, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def prefix_hits(url: str) -> float:
    return harness.scrape(url).get("vllm:prefix_cache_hits_total", 0.0)


def test_shared_prefix_lands_where_it_is_cached_and_follow_ups_prefill_locally(fleet):
    routed, plain = fleet["routed"].url, fleet["plain"].url
    prefills = {fleet["p1"].url: "p1", fleet["p2"].url: "p2"}
    with httpx.Client(timeout=180) as client:
        first = complete(routed, CONTEXT + QUESTIONS[0], client)
        holder = first.headers["x-pdspec-prefill-worker"]
        assert holder in prefills
        other = next(url for url in prefills if url != holder)
        # The events of the prefill worker and of the decode worker (the blocks it pulled
        # over NIXL are in its prefix cache too) reach the proxy's index.
        wait_for(lambda: index_blocks(routed).get(holder, 0) > 0, "the prefill worker's KV events")
        wait_for(lambda: index_blocks(routed).get(fleet["d"].url, 0) > 0, "the decode worker's KV events")
        hits_before = {url: prefix_hits(url) for url in prefills}
        served = []
        for question in QUESTIONS[1:]:
            response = complete(routed, CONTEXT + question * 12, client)
            served.append(response.headers["x-pdspec-prefill-worker"])
        assert served == [holder] * 3
        assert prefix_hits(holder) - hits_before[holder] >= 3 * len(CONTEXT) // 8  # the context hit, each time
        assert prefix_hits(other) == hits_before[other]

        # A short follow-up turn: the decode worker holds all of the conversation but the new line.
        conversation = CONTEXT + QUESTIONS[0] + first.json()["choices"][0]["text"]
        follow_up = complete(routed, conversation + "\n# and?", client)
        assert follow_up.headers["x-pdspec-prefill-worker"] == "local"
        reference = complete(plain, conversation + "\n# and?", client)
        assert follow_up.json()["choices"][0]["text"] == reference.json()["choices"][0]["text"]
    local = harness.scrape_labeled(routed, "pdspec_proxy_local_prefills_total")
    assert local[(("reason", "cached_on_decode"),)] >= 1
    # Every one of those prompts was keyed by the proxy's own ids: none went to /tokenize.
    sources = token_id_sources(routed)
    assert sources["proxy"] >= 5 and sources["worker"] == 0 and sources["none"] == 0
    events = {
        dict(labels)["kind"]: v for labels, v in harness.scrape_labeled(routed, "pdspec_proxy_kv_events_total").items()
    }
    assert events.get("stored", 0) > 0 and events.get("bad_messages", 0) == 0 and events.get("orphans", 0) == 0


def test_with_no_decode_kv_room_a_long_prompt_is_served_whole_by_a_prefill_worker(fleet):
    """decode_full on real workers: the proxy reads each worker's KV size from its
    vllm:cache_config_info, finds the decode worker full by its count (the `spill` proxy's
    decode_full_share) and a prefill worker with room, and sends the request there whole,
    no prefill leg and no KV transfer: the same greedy text as the disaggregated path,
    streamed and not, no leg on the decode worker, and no KV left held on the prefill
    worker afterwards."""
    spill, plain = fleet["spill"].url, fleet["plain"].url
    prefills = {fleet["p1"].url, fleet["p2"].url}
    context = CONTEXT.replace("helper", "spilled")  # uncached everywhere: no local prefill
    prompts = [context + QUESTIONS[0] * 12, context + QUESTIONS[1] * 12]
    decode_prompts = harness.scrape(fleet["d"].url).get("vllm:prompt_tokens_total", 0.0)
    texts, served = [], set()
    with httpx.Client(timeout=180) as client:
        response = complete(spill, prompts[0], client)
        assert response.headers["x-pdspec-prefill-worker"] == "local"
        served.add(response.headers["x-pdspec-decode-worker"])
        texts.append(response.json()["choices"][0]["text"])
        body = {"model": "pdspec-tiny", "prompt": prompts[1], "max_tokens": 8, "temperature": 0, "stream": True}
        with client.stream("POST", spill + "/v1/completions", json=body) as streamed:
            assert streamed.status_code == 200 and streamed.headers["x-pdspec-prefill-worker"] == "local"
            served.add(streamed.headers["x-pdspec-decode-worker"])
            chunks = [line.removeprefix("data: ") for line in streamed.iter_lines() if line.startswith("data: {")]
        texts.append("".join(json.loads(c)["choices"][0]["text"] for c in chunks))
        assert served <= prefills  # served where the prefill workers run
        assert harness.scrape(fleet["d"].url).get("vllm:prompt_tokens_total", 0.0) == decode_prompts
        references = [complete(plain, prompt, client).json()["choices"][0]["text"] for prompt in prompts]
    assert texts == references
    local = harness.scrape_labeled(spill, "pdspec_proxy_local_prefills_total")
    assert local[(("reason", "decode_full"),)] == 2
    for url in served:  # the whole requests' KV freed: nothing held for a transfer
        wait_for(lambda url=url: harness.gauges(url)[1] == 0, f"{url}'s KV freed")


def predicted_hits(proxy: str) -> dict[str, float]:
    return {
        dict(labels)["worker"]: v
        for labels, v in harness.scrape_labeled(proxy, "pdspec_proxy_predicted_hit_tokens_total").items()
        if dict(labels)["pool"] == "prefill"
    }


def healthy_prefill(proxy: str) -> float:
    return harness.scrape_labeled(proxy, "pdspec_proxy_healthy_workers").get((("pool", "prefill"),), 0.0)


def test_a_holder_that_dies_or_restarts_gets_no_cache_affine_traffic_until_its_new_events(fleet):
    """The stale-index failure other routers' users report: an engine restarted in place
    comes back empty (its event sequence starts again), or is gone. Here the prefill worker
    holding a context is killed: the proxy forgets its blocks when it ejects it, and
    restarted on the same port it is readmitted with none, so no request is sent there for a
    hit it cannot give until its own new events say it holds the context again."""
    routed = fleet["routed"].url
    names = {fleet["p1"].url: "p1", fleet["p2"].url: "p2"}
    context = CONTEXT.replace("helper", "restarted")  # a context no other test sent
    with httpx.Client(timeout=180) as client:
        holder = complete(routed, context + QUESTIONS[0], client).headers["x-pdspec-prefill-worker"]
        name = names[holder]
        wait_for(lambda: index_blocks(routed).get(holder, 0) > 0, "the holder's KV events")

        fleet[name].kill()  # a crash: removed from the pool, its index entry with it
        wait_for(lambda: healthy_prefill(routed) == 1, "the proxy ejecting the dead worker")
        wait_for(lambda: index_blocks(routed).get(holder, 0) == 0, "the dead worker's blocks forgotten")
        # Long enough a question that the decode worker (which holds the context too) does
        # not prefill it itself: the prefill pool's choice is what is looked at.
        while_down = complete(routed, context + QUESTIONS[1] * 12, client)
        assert while_down.headers["x-pdspec-prefill-worker"] not in (holder, "local")

        # Restarted in place: same port and side channel, a new engine with an empty cache.
        fleet[name] = fleet["shared"].restart(name)
        wait_for(lambda: healthy_prefill(routed) == 2, "the restarted worker readmitted", timeout_s=120)
        assert index_blocks(routed).get(holder, 0) == 0  # it came back holding nothing
        predicted_before = predicted_hits(routed).get(holder, 0.0)
        hits_before = prefix_hits(holder)
        for question in QUESTIONS[2:]:
            served = complete(routed, context + question * 12, client).headers["x-pdspec-prefill-worker"]
            assert served != holder, "routed to the restarted worker for a hit it cannot give"
        assert predicted_hits(routed).get(holder, 0.0) == predicted_before
        assert prefix_hits(holder) == hits_before


def test_the_dashboards_routing_row_on_a_real_prometheus(fleet, tmp_path_factory):
    """The "Cache-aware routing" row (which the shared stack cannot fill) over this fleet."""
    host = lambda server: server.url.removeprefix("http://")  # noqa: E731
    prometheus = PrometheusServer(tmp_path_factory.mktemp("prometheus"), unused_port(18971, 18989))
    prometheus.start(
        {
            "pdspec-proxy": [host(fleet["routed"])],
            "pdspec-prefill": [host(fleet["p1"]), host(fleet["p2"])],
            "pdspec-decode": [host(fleet["d"])],
        }
    )
    try:
        with httpx.Client(timeout=180) as client:
            for question in QUESTIONS:  # traffic inside Prometheus's window
                complete(fleet["routed"].url, CONTEXT + question * 12, client)
        prometheus.wait_for("sum(pdspec_proxy_predicted_hit_tokens_total)", bool, what="the routing counters scraped")
        row = [q for q in panel_queries(load_dashboard()) if q.row == "Cache-aware routing"]
        assert len(row) >= 5
        # Rates need two samples of a counter after it moved, from each target: scraped every
        # second, but a busy worker's first scrapes can lag the proxy's (CI once queried the
        # vLLM-hits panel a moment too early), so each panel gets its own wait.
        empty = [
            q.name
            for q in row
            if not harness.wait_for(
                lambda q=q: bool(prometheus.api.query(substitute(q.expr, "2m", "10m"))), timeout_s=60
            )
        ]
        assert not empty, f"routing panels with no data: {empty}"
    finally:
        prometheus.stop()
