"""Cache-aware routing against stand-in workers: the kv_aware policies keep a prompt's
prefix on the workers that hold it, conditional disaggregation lets the decode worker
prefill what it (nearly) holds, and a prompt whose token ids cannot be read is routed
by load. The stand-ins publish no KV events, so the index knows only the proxy's own
routing notes (kv_routed_ttl_s); the events themselves are tested in test_kv_subscriber.py
and with real workers in tests/e2e/test_kv_routing.py."""

import json
import types

import httpx
import pytest

from pdspec.settings import RoutingSettings
from proxy.fleet.pool import CHURN_HALF_LIFE_S, DecayingSum, Worker, WorkerPool
from proxy.metrics import ProxyMetrics
from proxy.routing import registry
from proxy.routing.kv_events import Cleared, Stored
from proxy.routing.kv_router import KvRouter
from proxy.routing.plan import local_prefill_tokens
from tests.harness import merged, wait_for
from tests.proxy_cluster import PAIRED_INFO as INFO
from tests.proxy_cluster import Fleet, sample
from tests.standin import StandinBehaviour, decode_legs

KV_AWARE = {
    "routing": {"prefill_policy": "kv_aware", "decode_policy": "kv_aware", "kv_routed_ttl_s": 600},
    "health": {"interval_s": 0.05},
}
LONG = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 3


def prefill_legs(b: StandinBehaviour) -> int:
    return sum(1 for body in b.received if (body.get("kv_transfer_params") or {}).get("do_remote_decode"))


def complete(fleet: Fleet, prompt: str) -> httpx.Response:
    response = httpx.post(fleet.url + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 3})
    assert response.status_code == 200, response.text
    return response


def metric(fleet: Fleet, name: str) -> float | None:
    return sample(httpx.get(fleet.url + "/metrics").text, name)


def test_a_shared_prefix_stays_on_the_workers_that_hold_it():
    with Fleet(2, 2, INFO, **KV_AWARE) as fleet:
        complete(fleet, LONG)
        first_p = [prefill_legs(b) for b in fleet.prefills]
        first_d = [len(decode_legs(b)) for b in fleet.decodes]
        for question in ("# what does it print?", "# is it fast?", "# rewrite it"):
            complete(fleet, LONG + question)
        # Every later request went where the first one did.
        assert [prefill_legs(b) for b in fleet.prefills] == [4 * n for n in first_p]
        assert [len(decode_legs(b)) for b in fleet.decodes] == [4 * n for n in first_d]
        assert metric(fleet, 'pdspec_proxy_routing_decisions_total{pool="prefill",reason="cache_hit"}') == 3


def test_new_contexts_after_a_shared_system_prompt_spread_over_the_workers():
    """Both prefill workers hold one system prompt and are idle, so for a prompt with a new
    context after it the scores tie. The tie-break keys on the part no worker holds (the
    context), not on the prompt's shared start: new contexts spread over both workers
    instead of all churning one worker's cache while the other's stays cold."""
    with Fleet(2, 1, INFO, KV_AWARE, routing={"kv_aware_churn_weight": 0}) as fleet:  # the tie-break alone
        for server in fleet.servers[:2]:
            publish_held(fleet, server.url, LONG)
        for i in range(16):  # all on one worker by chance: 2 in 2**16
            complete(fleet, LONG + chr(ord("A") + i) * 4 + f" context {i}: " + "x" * 40)  # new from its 1st char
        assert all(prefill_legs(b) > 0 for b in fleet.prefills), [prefill_legs(b) for b in fleet.prefills]
        # Every one was a tie with something cached (the system prompt) on both.
        assert metric(fleet, 'pdspec_proxy_routing_decisions_total{pool="prefill",reason="cache_hit"}') == 16


def test_new_contexts_spread_although_one_worker_alone_holds_the_system_prompt():
    """Only one prefill worker holds the shared system prompt, so it scores higher for every
    new context while idle. Its share of the cache churn (the misses it computed) soon
    outweighs that, the contexts being longer than the system prompt: new contexts then go
    to the other worker too."""
    with Fleet(2, 1, INFO, **KV_AWARE) as fleet:
        publish_held(fleet, fleet.servers[0].url, LONG)
        for i in range(8):
            complete(fleet, LONG + chr(ord("A") + i) * 4 + f" context {i}: " + "x" * 600)
        assert [prefill_legs(b) > 0 for b in fleet.prefills] == [True, True]


def test_prefix_affinity_keeps_a_conversation_on_one_prefill_worker_beside_a_kv_aware_decode_pool():
    """A route plan exists (the decode pool is kv_aware), so prefix_affinity's key comes
    from the plan's ids: their start, which every turn of a conversation shares, not
    kv_aware's key (the first block no worker holds), which moves on with every turn."""
    with Fleet(2, 1, INFO, **merged(KV_AWARE, {"routing": {"prefill_policy": "prefix_affinity"}})) as fleet:
        history = LONG
        for turn in range(12):  # all on one worker by chance, with a moving key: 2 in 2**12
            history += f"# turn {turn}: " + chr(ord("A") + turn) * 40 + "\n"
            complete(fleet, history)
        assert sorted(prefill_legs(b) for b in fleet.prefills) == [0, 12]


def send_burst(fleet: Fleet, prompts: list[str], while_first_runs=None) -> None:
    """The first prompt, then the rest while its prefill leg is still running (stand-ins
    with `delay_s`); `while_first_runs(fleet)` is called once the first leg is on a worker."""
    import threading

    threads = [threading.Thread(target=complete, args=(fleet, prompt)) for prompt in prompts]
    threads[0].start()
    assert wait_for(lambda: sum(w.pending_tokens for w in fleet.app.state.pools[0].workers) > 0, 5)
    if while_first_runs is not None:
        while_first_runs(fleet)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(30)


def test_a_burst_sharing_a_new_prefix_stays_on_the_worker_computing_it():
    """The first request's prefill leg is still computing the prefix when the others are
    routed: they follow it there (its routing note), not to the idle worker, although its
    pending tokens make the holder look busy (they are this prefix's own)."""
    with Fleet(2, 1, INFO, **KV_AWARE) as fleet:
        for b in fleet.prefills:
            b.delay_s = 0.5
        # A prefix worth more than the 3 more legs in flight at kv_aware_load_tokens each.
        send_burst(fleet, [LONG * 4 + q for q in ("# a", "# b", "# c", "# d")])
        assert sorted(prefill_legs(b) for b in fleet.prefills) == [0, 4]


def test_a_prefill_leg_leases_its_uncached_tokens_until_it_ends():
    """kv_aware's load: while the first prefill leg runs, its worker has the prompt's tokens
    pending (nothing of it cached anywhere); every leg's tokens are given back at its end,
    failed ones included."""
    seen = {}

    def pending(fleet):
        seen.update({w.url: w.pending_tokens for w in fleet.app.state.pools[0].workers})

    with Fleet(2, 1, INFO, **KV_AWARE) as fleet:
        fleet.prefills[0].delay_s = fleet.prefills[1].delay_s = 0.3
        send_burst(fleet, [LONG], while_first_runs=pending)
        holder = max(seen, key=seen.get)
        assert seen[holder] == len(LONG.encode())  # the stand-ins' token ids are the prompt's bytes
        assert sorted(seen.values())[0] == 0  # the other worker: nothing
        fleet.prefills[0].prefill_status = fleet.prefills[1].prefill_status = 503  # failed legs, retried
        with pytest.raises(AssertionError):
            complete(fleet, "another prompt " * 20)
        assert [w.pending_tokens for w in fleet.app.state.pools[0].workers] == [0, 0]
        assert [w.outstanding for w in fleet.app.state.pools[0].workers] == [0, 0]


def test_a_decode_leg_leases_its_prompt_tokens_while_it_streams():
    """kv_aware's decode load: a decode leg holds its whole prompt's KV on its worker
    until its stream ends."""
    seen = []
    with Fleet(1, 1, INFO, **KV_AWARE) as fleet:
        fleet.decodes[0].stream_event_delay_s = 0.2
        decode = fleet.app.state.pools[1].workers[0]
        with httpx.stream(
            "POST", fleet.url + "/v1/completions", json={"model": "m", "prompt": LONG, "max_tokens": 3, "stream": True}
        ) as response:
            for _ in response.iter_lines():
                seen.append(decode.pending_tokens)
        assert seen[0] == len(LONG.encode())  # the stand-ins' token ids are the prompt's bytes
        assert wait_for(lambda: decode.pending_tokens == 0 and decode.outstanding == 0, 5)


def test_conditional_disaggregation_prefills_on_the_decode_worker_that_holds_the_prompt():
    settings = merged(
        KV_AWARE,
        {
            "routing": {"disaggregation": "conditional", "local_prefill_max_tokens": 64},
            "observability": {"served_by_headers": True},
        },
    )
    with Fleet(1, 1, INFO, **settings) as fleet:
        first = complete(fleet, LONG)
        assert prefill_legs(fleet.prefills[0]) == 1
        assert first.headers["x-pdspec-prefill-worker"] == fleet.servers[0].url
        # A routing note alone is no reason to prefill locally: the KV may not be there yet.
        complete(fleet, LONG + "# again")
        assert prefill_legs(fleet.prefills[0]) == 2
        # The decode worker's events say it holds the prompt's blocks (it pulled them).
        publish_held(fleet, fleet.servers[1].url, LONG)
        follow_up = complete(fleet, LONG + "# next turn")  # 11 new tokens: under 64
        assert prefill_legs(fleet.prefills[0]) == 2  # no prefill leg this time
        assert decode_legs(fleet.decodes[0])[-1].get("kv_transfer_params") is None  # the decode worker prefills
        assert follow_up.headers["x-pdspec-prefill-worker"] == "local"
        assert follow_up.headers["x-pdspec-decode-worker"] == fleet.servers[1].url
        assert metric(fleet, 'pdspec_proxy_local_prefills_total{reason="cached_on_decode"}') == 1
        complete(fleet, "x = 1")  # short and never seen
        assert prefill_legs(fleet.prefills[0]) == 2
        assert metric(fleet, 'pdspec_proxy_local_prefills_total{reason="short_prompt"}') == 1
        complete(fleet, "y = 2\n" * 30)  # long and never seen: disaggregated
        assert prefill_legs(fleet.prefills[0]) == 3


def publish_held(fleet: Fleet, worker_url: str, text: str) -> None:
    """As the worker's KV events would: the full blocks of `text` (the stand-ins' token
    ids are its bytes, 4 to a block) stored, in one BlockStored."""
    tokens = list(text.encode())
    blocks = len(tokens) // 4
    fleet.app.state.kv_router.index.apply(
        worker_url, [Stored(tuple(range(1, blocks + 1)), None, tuple(tokens[: blocks * 4]), 4)]
    )


def test_a_prompt_without_token_ids_is_routed_by_load_and_served():
    with Fleet(2, 1, INFO, **merged(KV_AWARE, {"routing": {"disaggregation": "conditional"}})) as fleet:
        fleet.decodes[0].tokenize_status = 500
        complete(fleet, LONG)
        assert sum(prefill_legs(b) for b in fleet.prefills) == 1  # always disaggregated without ids
        assert metric(fleet, 'pdspec_proxy_routing_decisions_total{pool="any",reason="no_token_ids"}') == 1


def test_token_id_prompts_need_no_tokenize_call():
    with Fleet(1, 1, INFO, **KV_AWARE) as fleet:
        response = httpx.post(
            fleet.url + "/v1/completions", json={"model": "m", "prompt": list(range(40)), "max_tokens": 2}
        )
        assert response.status_code == 200
        assert fleet.decodes[0].tokenized == []


def test_served_by_headers_are_off_by_default():
    with Fleet(1, 1, INFO, **KV_AWARE) as fleet:
        response = complete(fleet, LONG)
        assert "x-pdspec-prefill-worker" not in response.headers
        assert "x-pdspec-decode-worker" not in response.headers
        assert "server-timing" not in response.headers


def server_timing(response: httpx.Response) -> dict[str, float]:
    parts = [part.strip().split(";dur=") for part in response.headers["server-timing"].split(",")]
    return {name: float(ms) for name, ms in parts}


def test_server_timing_says_where_a_request_spent_its_time_before_its_stream():
    """With served_by_headers, a reply's Server-Timing has its phases in milliseconds:
    the route plan (the /tokenize call here), the prefill leg, the decode leg to its
    reply's headers. Each stand-in's delay shows up in its own phase."""
    with Fleet(1, 1, INFO, **KV_AWARE, observability={"served_by_headers": True}) as fleet:
        fleet.decodes[0].tokenize_delay_s = 0.2
        fleet.prefills[0].delay_s = 0.6
        with httpx.stream(
            "POST", fleet.url + "/v1/completions", json={"model": "m", "prompt": LONG, "max_tokens": 3, "stream": True}
        ) as response:
            timing = server_timing(response)
            list(response.iter_lines())
        assert list(timing) == ["route", "prefill", "decode"]
        assert timing["route"] >= 200 and timing["prefill"] >= 600
        assert timing["route"] < timing["prefill"]  # each delay counted once, in its own phase
        fleet.decodes[0].tokenize_delay_s = fleet.prefills[0].delay_s = 0.0
        fleet.decodes[0].delay_s = 0.6
        timing = server_timing(complete(fleet, LONG + "# again"))  # not streamed: decode is the whole leg
        assert timing["decode"] >= 600 > timing["prefill"] + timing["route"]


def test_churn_halves_every_half_life_and_a_lease_adds_its_tokens():
    now = [0.0]
    churn = DecayingSum(30.0, clock=lambda: now[0])
    churn.add(800)
    now[0] = 30.0
    assert churn.value() == pytest.approx(400)
    churn.add(100)
    now[0] = 60.0
    assert churn.value() == pytest.approx(250)
    worker = Worker("http://w0")
    worker.churn = DecayingSum(CHURN_HALF_LIFE_S, clock=lambda: 0.0)
    with worker.lease(700):
        pass
    with worker.lease():  # a leg that says no tokens stores none
        pass
    assert worker.churn.value() == 700


def test_a_lease_holds_its_tokens_until_released_once():
    worker = Worker("http://w0")
    with worker.lease(700):
        lease = worker.lease(300)
        assert (worker.outstanding, worker.pending_tokens) == (2, 1000)
        lease.release()
        lease.release()  # idempotent
        assert (worker.outstanding, worker.pending_tokens) == (1, 700)
    assert (worker.outstanding, worker.pending_tokens) == (0, 0)


def test_every_count_the_router_exports_is_a_declared_kind():
    from proxy.metrics import KV_EVENT_KINDS
    from proxy.routing.kv_index import IndexCounts
    from proxy.routing.kv_subscriber import SubscriberCounts

    exported = set(vars(IndexCounts())) | (set(vars(SubscriberCounts())) - {"batches"})
    assert exported == set(KV_EVENT_KINDS)


def test_the_index_gauge_of_a_worker_whose_cache_was_cleared_falls_to_zero():
    metrics = ProxyMetrics.create()
    router = KvRouter(RoutingSettings(prefill_policy="kv_aware"), None, None, None, metrics)
    url = "http://w"
    router.subscriptions[url] = types.SimpleNamespace(  # as a live subscription of `url`
        subscriber=types.SimpleNamespace(counts=types.SimpleNamespace(), lag_s=0.0)
    )
    router.index.set_block_size(url, 4)
    router.index.apply(
        url, [Stored(block_hashes=(1, 2), parent_block_hash=None, token_ids=tuple(range(8)), block_size=4)]
    )

    def gauge() -> float:
        return metrics.registry.get_sample_value("pdspec_proxy_kv_index_blocks", {"worker": url})

    router._export()
    assert gauge() == 2
    router.index.apply(url, [Cleared()])
    router._export()
    assert gauge() == 0


# --- Responses and Messages: token ids from the decode worker's render endpoint ----------

INSTRUCTIONS = "You review Python code. Context:\n" + LONG


def held_render_prefix(fleet: Fleet, worker_url: str, context: str) -> None:
    """As the worker's KV events would after serving a request whose rendered prompt
    starts with `context`: the stand-ins render `[context, rest]` as its JSON's bytes, so
    `["<context>",` is the part every such prompt shares."""
    publish_held(fleet, worker_url, json.dumps([context])[:-1] + ",")


def respond(fleet: Fleet, body: dict) -> httpx.Response:
    response = httpx.post(fleet.url + "/v1/responses", json={"model": "m", "max_output_tokens": 3, **body})
    assert response.status_code == 200, response.text
    return response


def message(fleet: Fleet, body: dict) -> httpx.Response:
    response = httpx.post(fleet.url + "/v1/messages", json={"model": "m", "max_tokens": 3, **body})
    assert response.status_code == 200, response.text
    return response


@pytest.mark.parametrize("holder", [0, 1])
def test_a_responses_request_goes_to_the_workers_holding_its_rendered_prefix(holder):
    """Planned from `/v1/responses/render`'s ids: the prefill and decode workers whose
    events hold the shared `instructions` get it, whichever they are (both parametrized
    holders must win, so the prompt's hash alone cannot pass the test)."""
    with Fleet(2, 2, INFO, **KV_AWARE, observability={"served_by_headers": True}) as fleet:
        prefill, decode = fleet.servers[holder].url, fleet.servers[2 + holder].url
        held_render_prefix(fleet, prefill, INSTRUCTIONS)
        held_render_prefix(fleet, decode, INSTRUCTIONS)
        response = respond(fleet, {"instructions": INSTRUCTIONS, "input": "Is it fast?", "stream": True, "store": True})
        assert response.headers["x-pdspec-prefill-worker"] == prefill
        assert response.headers["x-pdspec-decode-worker"] == decode
        assert metric(fleet, 'pdspec_proxy_routing_decisions_total{pool="prefill",reason="cache_hit"}') == 1
        assert metric(fleet, 'pdspec_proxy_routing_decisions_total{pool="decode",reason="cache_hit"}') == 1
        # One render, on a decode worker, of the decode leg's body without its KV params, not streamed.
        rendered = [r for b in fleet.decodes + fleet.prefills for r in b.rendered]
        assert [path for path, _ in rendered] == ["/v1/responses/render"]
        leg = decode_legs(fleet.decodes[holder])[-1]
        assert rendered[0][1] == {**{k: v for k, v in leg.items() if k != "kv_transfer_params"}, "stream": False}
        assert leg["stream"] is True and leg["store"] is False and leg["kv_transfer_params"] is not None
        assert fleet.decodes[0].tokenized == fleet.decodes[1].tokenized == []  # no /tokenize for Responses


@pytest.mark.parametrize("holder", [0, 1])
def test_a_messages_request_goes_to_the_workers_holding_its_rendered_system(holder):
    with Fleet(2, 2, INFO, **KV_AWARE, observability={"served_by_headers": True}) as fleet:
        prefill, decode = fleet.servers[holder].url, fleet.servers[2 + holder].url
        held_render_prefix(fleet, prefill, INSTRUCTIONS)
        held_render_prefix(fleet, decode, INSTRUCTIONS)
        response = message(fleet, {"system": INSTRUCTIONS, "messages": [{"role": "user", "content": "Is it fast?"}]})
        assert response.headers["x-pdspec-prefill-worker"] == prefill
        assert response.headers["x-pdspec-decode-worker"] == decode
        rendered = [r for b in fleet.decodes + fleet.prefills for r in b.rendered]
        assert [path for path, _ in rendered] == ["/v1/messages/render"]
        leg = decode_legs(fleet.decodes[holder])[-1]
        assert rendered[0][1] == {**{k: v for k, v in leg.items() if k != "kv_transfer_params"}, "stream": False}


def test_requests_sharing_a_messages_system_follow_one_another():
    """The body's affinity key leaves a Messages `system` out; the rendered ids' start
    (the plan's rendezvous key) and the routing notes keep a burst sharing one together."""
    with Fleet(2, 2, INFO, **KV_AWARE, observability={"served_by_headers": True}) as fleet:
        served = {
            (r.headers["x-pdspec-prefill-worker"], r.headers["x-pdspec-decode-worker"])
            for r in (
                message(fleet, {"system": INSTRUCTIONS, "messages": [{"role": "user", "content": q}]})
                for q in ("Is it fast?", "Rewrite it.", "What does it print?", "Explain it.")
            )
        }
        assert len(served) == 1
        assert metric(fleet, 'pdspec_proxy_routing_decisions_total{pool="prefill",reason="cache_hit"}') == 3


@pytest.mark.parametrize("breakage", ["scale_out_off", "render_404", "render_slow", "odd_reply"])
def test_a_request_whose_render_fails_is_routed_without_cache_knowledge_and_served(breakage):
    settings = merged(KV_AWARE, {"routing": {"disaggregation": "conditional", "tokenize_timeout_s": 0.2}})
    with Fleet(2, 1, INFO, **settings) as fleet:
        behaviour = fleet.decodes[0]
        if breakage == "scale_out_off":
            behaviour.scale_out = False
        elif breakage == "render_404":
            behaviour.render_status = 404
        elif breakage == "render_slow":
            behaviour.render_delay_s = 1.0
        else:
            behaviour.render_reply = b'{"token_ids": "nope"}'
        respond(fleet, {"instructions": INSTRUCTIONS, "input": "Is it fast?"})
        message(fleet, {"system": INSTRUCTIONS, "messages": [{"role": "user", "content": "Is it fast?"}]})
        assert len(behaviour.rendered) == 2
        assert sum(prefill_legs(b) for b in fleet.prefills) == 2  # always disaggregated without ids
        assert metric(fleet, 'pdspec_proxy_routing_decisions_total{pool="any",reason="no_token_ids"}') == 2


# --- conditional disaggregation's queue rule, on stand-in pools ------------------------

PROMPT = list(range(4096))  # uncached everywhere unless a test says otherwise


def queue_router(prefill_legs: list[int], **routing) -> KvRouter:
    """A router over a kv_aware prefill pool whose workers run `prefill_legs[i]` legs of
    4096 uncached tokens each, and one idle decode worker; conditional disaggregation with
    the default weights (margin local_prefill_max_tokens 512, kv_aware_load_tokens 256)."""
    settings = RoutingSettings(
        **{"prefill_policy": "kv_aware", "disaggregation": "conditional", "kv_routed_ttl_s": 0, **routing}
    )
    prefill = WorkerPool(
        "prefill", [Worker(f"http://p{i}") for i in range(len(prefill_legs))], registry.for_pool(settings, "prefill")
    )
    for worker, legs in zip(prefill.workers, prefill_legs):
        for _ in range(legs):
            worker.lease(4096)
    decode = WorkerPool("decode", [Worker("http://d0")], registry.for_pool(settings, "decode"))
    router = KvRouter(settings, None, prefill, decode, ProxyMetrics.create())
    for worker in prefill.workers + decode.workers:
        router.index.set_block_size(worker.url, 4)
    return router


def test_a_long_prompt_is_prefilled_on_the_decode_worker_when_the_prefill_pool_is_the_longer_queue():
    # Prefill side: 4096 of the prompt + 4096 queued + 256 a leg + 256 the hand-off; decode: 4096.
    plan = queue_router([1, 1]).plan_for(PROMPT, 4)
    assert plan.local_prefill == "prefill_queue"
    assert plan.decode_uncached == 4096


@pytest.mark.parametrize(
    "prefill_legs, routing",
    [
        ([0, 0], {}),  # an idle prefill pool: the hand-off's cost alone is no reason
        ([3, 0], {}),  # one prefill worker idle: the prompt starts there at once
        # The same with a margin under the hand-off's cost (256), which alone would be enough.
        ([0, 0], {"local_prefill_max_tokens": 64}),
        ([3, 0], {"local_prefill_max_tokens": 64}),
        ([3, 3], {"local_prefill_on_queue": False}),  # the rule switched off
        ([3, 3], {"prefill_policy": "prefix_affinity"}),  # no prefill-side token accounting
        ([3, 3], {"disaggregation": "always"}),
    ],
)
def test_a_long_uncached_prompt_is_disaggregated_without_a_prefill_queue_to_weigh(prefill_legs, routing):
    plan = queue_router(prefill_legs, **routing).plan_for(PROMPT, 4)
    # Conditional disaggregation weighs one decode worker, picked first; otherwise the
    # decode leg picks its worker at its hand-off.
    assert (plan.decode_worker is not None) == (routing.get("disaggregation") != "always")
    assert plan.local_prefill is None


def test_a_decode_worker_with_local_prefills_in_flight_stops_taking_more():
    """Prefill workers 3 legs of 4k deep: 13,312 tokens more ahead than on the idle decode
    worker. Each prompt it takes leases its 4k there until its first token, so it takes 4
    (13,312 - 3 * 4096 = 1,024 > 512; then 13,312 - 4 * 4096 < 512), and one more once a
    local prefill is done: the queues balance."""
    router = queue_router([3, 3])
    decode = router.decode_pool.workers[0]
    leases = []
    while (plan := router.plan_for(PROMPT, 4)).local_prefill == "prefill_queue":
        leases.append(decode.lease(plan.prompt_tokens, computed=False, prefilling=local_prefill_tokens(plan, decode)))
        assert len(leases) < 10
    assert len(leases) == 4
    assert decode.local_prefill_tokens == 4 * 4096
    leases[0].prefilled()  # its first token: streaming now, no longer ahead of anything
    assert router.plan_for(PROMPT, 4).local_prefill == "prefill_queue"


def test_a_prompt_a_busy_prefill_worker_holds_stays_disaggregated():
    """The prefill worker holding the whole prompt has only its queue ahead of it (4096 + 256
    + 256 for the hand-off), no more than the decode worker's 4096 to compute plus the
    margin; the same queue without the hit would send the prompt to the decode worker."""
    router = queue_router([1, 1])
    router.index.apply("http://p0", [Stored(tuple(range(1, 1025)), None, tuple(PROMPT), 4)])
    assert router.plan_for(PROMPT, 4).local_prefill is None
    router.index.forget("http://p0")
    assert router.plan_for(PROMPT, 4).local_prefill == "prefill_queue"


def test_a_local_prefill_leases_its_tokens_on_its_decode_worker_until_its_first_token():
    """End to end on stand-ins: the prefill worker is busy with a long prompt, so the next
    one is prefilled on the decode worker (counted as prefill_queue); until its first byte
    the decode worker has that prompt's tokens ahead, while it streams no longer."""
    import threading

    settings = merged(KV_AWARE, {"routing": {"disaggregation": "conditional", "local_prefill_max_tokens": 64}})
    with Fleet(1, 1, INFO, **settings) as fleet:
        # Wide windows, so that a loaded CI machine still sees each state: the first prompt
        # holds the prefill worker 3 s, the local prefill's headers come after 1 s.
        fleet.prefills[0].delay_s = 3.0
        decode = fleet.app.state.pools[1].workers[0]
        first = threading.Thread(target=complete, args=(fleet, LONG))
        first.start()
        assert wait_for(lambda: fleet.app.state.pools[0].workers[0].pending_tokens > 0, 5)
        fleet.decodes[0].delay_s = 1.0  # the local prefill's leg: its headers come after this
        fleet.decodes[0].stream_event_delay_s = 0.1
        prompt = "y = 2\n" * 40
        leased = []  # whether the decode worker had the prompt's tokens ahead before its first byte
        watcher = threading.Thread(
            target=lambda: leased.append(
                wait_for(lambda: decode.local_prefill_tokens == len(prompt.encode()), 5, poll_s=0.02)
            )
        )
        watcher.start()
        streaming = []
        with httpx.stream(
            "POST",
            fleet.url + "/v1/completions",
            json={"model": "m", "prompt": prompt, "max_tokens": 3, "stream": True},
        ) as response:
            assert response.status_code == 200
            for _ in response.iter_lines():
                streaming.append((decode.local_prefill_tokens, decode.outstanding))
        watcher.join(5)
        first.join(10)
        assert leased == [True]  # the stand-ins' ids are the prompt's bytes
        assert streaming[0] == (0, 1)  # streaming: its prefill is done, its leg still open
        assert wait_for(lambda: decode.local_prefill_tokens == 0 and decode.outstanding == 0, 5)
        assert prefill_legs(fleet.prefills[0]) == 1  # the second prompt had no prefill leg
        assert decode_legs(fleet.decodes[0])[0].get("kv_transfer_params") is None
        assert metric(fleet, 'pdspec_proxy_local_prefills_total{reason="prefill_queue"}') == 1


# --- conditional disaggregation's decode_full rule, on stand-in pools ----------------------


def full_router(decode_held: list[int], prefill_held: list[int], sizes: int | None = 16_384, **routing) -> KvRouter:
    """A router over decode and prefill workers of `sizes` tokens of KV each (None: unknown)
    whose legs hold `decode_held[i]` and `prefill_held[i]` of it; conditional disaggregation,
    its other settings and policies the defaults (prefix_affinity, least_outstanding)."""
    settings = RoutingSettings(**{"disaggregation": "conditional", "kv_routed_ttl_s": 0, **routing})

    def pool(name: str, held: list[int]) -> WorkerPool:
        workers = [Worker(f"http://{name[0]}{i}", kv_tokens=sizes) for i in range(len(held))]
        for worker, tokens in zip(workers, held):
            worker.lease(held=tokens)
        return WorkerPool(name, workers, registry.for_pool(settings, name))

    prefill, decode = pool("prefill", prefill_held), pool("decode", decode_held)
    router = KvRouter(settings, None, prefill, decode, ProxyMetrics.create())
    for worker in prefill.workers + decode.workers:
        router.index.set_block_size(worker.url, 4)
    return router


def test_a_prompt_no_decode_worker_has_room_for_is_served_whole_on_a_prefill_worker_with_room():
    router = full_router([14_000, 13_000], [16_384, 8_000])  # 4096 more fits neither decode worker
    plan = router.plan_for(PROMPT, 4)
    assert (plan.local_prefill, plan.whole_on) == ("decode_full", router.prefill_pool.workers[1])


def test_requests_a_prefill_worker_serves_whole_do_not_turn_decode_full_into_a_prefill_queue():
    """Found in review: the requests a prefill worker decodes whole count as its legs in
    flight, which the queue rule reads as a prefill queue; were it weighed first, two such
    requests a worker sent the prompt to a full decode worker (prefill_queue), to wait
    there for KV room. decode_full is decided before the queue rule."""
    router = full_router([14_000, 13_000], [0, 0], prefill_policy="kv_aware")
    for worker in router.prefill_pool.workers:
        for _ in range(2):  # each decoding two whole requests, past their first token
            worker.lease(computed=False, held=4096, computing=4096).prefilled()
    plan = router.plan_for(PROMPT, 4)
    assert plan.local_prefill == "decode_full" and plan.whole_on in router.prefill_pool.workers


def test_the_decode_share_setting_reaches_the_rule():
    """decode_full_share 0.5: decode workers holding 5,000 of 16,384 have room for the
    4,096-token prompt on their whole size, none within half of it."""
    assert full_router([5_000, 5_000], [0]).plan_for(PROMPT, 4).whole_on is None
    router = full_router([5_000, 5_000], [0], decode_full_share=0.5)
    assert router.plan_for(PROMPT, 4).whole_on is router.prefill_pool.workers[0]


def test_the_prefill_share_setting_reaches_the_rule():
    """decode_full_prefill_share 0.75: a prefill worker holding 9,000 of 16,384 has room for
    the 4,096-token prompt on its whole size (13,096), not within 0.75 of it (12,288): the
    request is then disaggregated, to wait for decode KV."""
    assert full_router([14_000, 13_000], [9_000]).plan_for(PROMPT, 4).whole_on is not None
    router = full_router([14_000, 13_000], [9_000], decode_full_prefill_share=0.75)
    plan = router.plan_for(PROMPT, 4)
    assert (plan.whole_on, plan.local_prefill) == (None, None)


def test_with_decode_full_counts_pending_the_prompts_pending_for_the_decode_pool_take_its_room():
    """Decode workers of 16,384 holding 8,000 each: 16,768 of room, which four 4,096-token
    prompts planned disaggregated and not yet decoding (16,384) leave short of a fifth, and
    three (12,288) do not. Without the setting the pool's pending KV is not read; with the
    default it is."""
    for pending, routing, whole in [
        (4 * 4096, {"decode_full_counts_pending": True}, True),
        (3 * 4096, {"decode_full_counts_pending": True}, False),
        (4 * 4096, {"decode_full_counts_pending": False}, False),
        (4 * 4096, {}, True),
    ]:
        router = full_router([8_000, 8_000], [0], **routing)
        router.decode_pool.pend_decode(pending)
        plan = router.plan_for(PROMPT, 4)
        assert (plan.whole_on is router.prefill_pool.workers[0]) == whole, (pending, routing)
        assert plan.local_prefill == ("decode_full" if whole else None)


@pytest.mark.parametrize(
    "decode_held, prefill_held, sizes, routing",
    [
        ([14_000, 13_000], [0], 16_384, {"decode_on_prefill_when_full": False}),  # the rule switched off
        ([14_000, 13_000], [0], 16_384, {"disaggregation": "always"}),
        ([14_000, 13_000], [0], None, {}),  # sizes unknown: never full
        ([14_000, 12_000], [0], 16_384, {}),  # a decode worker has room: the hand-off's pick finds it
        ([14_000, 13_000], [12_289, 16_384], 16_384, {}),  # no prefill worker has room either
    ],
)
def test_a_long_prompt_is_disaggregated_unless_every_decode_worker_is_full_and_a_prefill_worker_has_room(
    decode_held, prefill_held, sizes, routing
):
    plan = full_router(decode_held, prefill_held, sizes, **routing).plan_for(PROMPT, 4)
    assert (plan.local_prefill, plan.whole_on) == (None, None)


def test_a_prompt_the_decode_worker_would_prefill_itself_stays_there():
    """decode_full decides only what would be disaggregated: a short prompt is still the
    decode worker's, full or not (its local prefill waits for its KV room as before)."""
    plan = full_router([16_000, 16_000], [0]).plan_for(PROMPT[:100], 4)
    assert (plan.local_prefill, plan.whole_on) == ("short_prompt", None)
