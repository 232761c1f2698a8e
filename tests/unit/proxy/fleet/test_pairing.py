"""Pairing safety: the rule (pure logic on pools), then through the real proxy app with
stand-in workers that export `pdspec_worker_info` (/ready, metrics, routing, re-joins)."""

import logging
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdspec.settings import ProxySettings
from proxy.fleet.pairing import EXPECTED, Pairing
from proxy.fleet.pool import WorkerPool
from tests.harness import merged
from tests.standin import StandinBehaviour, ThreadServer, create_standin, proxy_server

A = {
    "role": "x",
    "model": "/m/t",
    "drafter": "/m/eagle3",
    "method": "eagle3",
    "num_speculative_tokens": "3",
    "block_size": "128",
    "kv_connector": "pull",
    "vllm_version": "0.32.0",
    "drafts_policy": "auto",
}


def config(**changes) -> dict:
    return {**A, **changes}


def pools(prefill: list, decode: list) -> list[WorkerPool]:
    """Pools whose workers passed a health check and whose info was read (None: plain vLLM)."""
    made = []
    for name, infos in (("prefill", prefill), ("decode", decode)):
        pool = WorkerPool.from_urls(name, [f"http://{name}-{i}:8000" for i in range(len(infos))])
        for worker, info in zip(pool.workers, infos):
            worker.info, worker.info_read_at = (None if info is None else config(role=name, **info)), 1.0
        made.append(pool)
    return made


def admitted(ps) -> dict:
    return {p.name: [w.admitted for w in p.workers] for p in ps}


class Counted:
    def __init__(self):
        self.calls = []

    def __call__(self, pool, field):
        self.calls.append((pool, field))


def test_matching_pair_is_admitted_and_k_and_policy_may_differ():
    ps = pools([{"num_speculative_tokens": "0", "drafts_policy": "always"}], [{"vllm_version": "0.32.1"}])
    Pairing().update(ps)
    assert admitted(ps) == {"prefill": [True], "decode": [True]}


@pytest.mark.parametrize(
    "field, value",
    [("model", "/m/other"), ("drafter", ""), ("method", "none"), ("block_size", "64"), ("kv_connector", "push")],
)
def test_a_decode_worker_that_differs_is_refused_and_named(field, value, caplog):
    ps = pools([{}], [{}, {field: value}])
    counted = Counted()
    pairing = Pairing(count_refusal=counted)
    with caplog.at_level(logging.WARNING, "pdspec.proxy.pairing"):
        pairing.update(ps)
        pairing.update(ps)  # said and counted once, not at every health check
    assert admitted(ps) == {"prefill": [True], "decode": [True, False]}
    refused = ps[1].workers[1]
    assert refused.refusal == {
        "pool": "decode",
        "worker": "http://decode-1:8000",
        "against": "prefill worker http://prefill-0:8000",
        "fields": {field: {"worker": value, "reference": A[field]}},
    }
    assert counted.calls == [("decode", field)]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "http://decode-1:8000" in line and "http://prefill-0:8000" in line and field in line
    assert [w.url for w in ps[1].healthy()] == ["http://decode-0:8000"]


def test_a_worker_from_before_kv_connector_pairs_as_a_puller():
    """Workers from before pdspec exported kv_connector all pulled: an upgrade that replaces
    one role first still pairs, and a pusher is still refused against them."""
    ps = pools([{}], [{}, {"kv_connector": "push"}])
    del ps[0].workers[0].info["kv_connector"]  # the old prefill worker
    Pairing().update(ps)
    assert admitted(ps) == {"prefill": [True], "decode": [True, False]}


def test_the_config_both_pools_share_wins_over_the_first_worker():
    ps = pools([{"block_size": "64"}, {}], [{}, {}])
    Pairing().update(ps)
    assert admitted(ps) == {"prefill": [False, True], "decode": [True, True]}


def test_all_mismatched_the_prefill_worker_is_the_reference():
    ps = pools([{}], [{"drafter": "/m/other"}])
    pairing = Pairing()
    pairing.update(ps)
    assert admitted(ps) == {"prefill": [True], "decode": [False]}
    assert pairing.reference["drafter"] == A["drafter"]


def test_a_worker_back_with_another_config_does_not_move_the_reference():
    ps = pools([{}], [{}])
    pairing = Pairing()
    pairing.update(ps)
    prefill = ps[0].workers[0]
    prefill.info = config(role="prefill", block_size="64")  # restarted with another block size
    pairing.update(ps)
    assert admitted(ps) == {"prefill": [False], "decode": [True]}
    assert prefill.refusal["against"] == "decode worker http://decode-0:8000"


def test_reference_is_chosen_again_once_nobody_holds_it():
    ps = pools([{}], [{}])
    pairing = Pairing()
    pairing.update(ps)
    for pool in ps:  # a rolling upgrade: every worker now runs block size 64
        pool.workers[0].info = config(role=pool.name, block_size="64")
    ps[1].workers[0].healthy = False
    pairing.update(ps)  # the decode worker is down; the prefill worker alone holds 64
    ps[1].workers[0].healthy = True
    pairing.update(ps)
    assert admitted(ps) == {"prefill": [True], "decode": [True]}
    assert pairing.reference["block_size"] == "64"


def test_expected_config_refuses_even_agreeing_workers():
    ps = pools([{}], [{}])
    counted = Counted()
    Pairing(expected={"block_size": 64}, count_refusal=counted).update(ps)
    assert admitted(ps) == {"prefill": [False], "decode": [False]}
    assert ps[0].workers[0].refusal["against"] == EXPECTED
    assert counted.calls == [("prefill", "block_size"), ("decode", "block_size")]


def test_expected_config_picks_the_reference_among_matching_workers():
    ps = pools([{"block_size": "64"}, {}], [{"block_size": "64"}])
    Pairing(expected={"block_size": "128"}).update(ps)
    assert admitted(ps) == {"prefill": [False, True], "decode": [False]}


def test_worker_without_info_follows_the_setting():
    ps = pools([{}], [None])
    Pairing(unverified="admit").update(ps)
    assert admitted(ps) == {"prefill": [True], "decode": [True]}
    counted = Counted()
    Pairing(unverified="refuse", count_refusal=counted).update(ps)
    assert admitted(ps) == {"prefill": [True], "decode": [False]}
    assert counted.calls == [("decode", "worker_info")]


def test_info_not_read_yet_is_not_admitted():
    ps = pools([{}], [{}])
    ps[1].workers[0].info_read_at = None
    Pairing().update(ps)
    assert admitted(ps) == {"prefill": [True], "decode": [False]}


# --- through the proxy app, with stand-in workers --------------------------------------


def info(role: str, **changes) -> dict:
    return config(role=role, **changes)


class Cluster:
    """Stand-in workers (given by their pdspec_worker_info) behind a real proxy."""

    def __init__(self, prefill: list, decode: list, **settings):
        self.behaviours = [StandinBehaviour(worker_info=i) for i in prefill + decode]
        self.n_prefill = len(prefill)
        self.settings = settings

    def __enter__(self):
        self.servers = [ThreadServer(create_standin(b)).__enter__() for b in self.behaviours]
        urls = [s.url for s in self.servers]
        settings = ProxySettings(
            prefill_urls=urls[: self.n_prefill],
            decode_urls=urls[self.n_prefill :],
            **merged({"health": {"interval_s": 0.05}}, self.settings),
        )
        self.proxy = proxy_server(settings).__enter__()
        self.url = self.proxy.url
        return self

    def __exit__(self, *exc):
        self.proxy.__exit__(*exc)
        for server in self.servers:
            server.__exit__(*exc)

    def ready(self) -> httpx.Response:
        return httpx.get(self.url + "/ready")

    def wait_ready(self, status: int, timeout_s: float = 30) -> dict:
        deadline = time.monotonic() + timeout_s
        while (response := self.ready()).status_code != status:
            assert time.monotonic() < deadline, response.json()
            time.sleep(0.02)  # poll interval
        return response.json()

    def metric(self, name: str, **labels) -> float | None:
        for family in text_string_to_metric_families(httpx.get(self.url + "/metrics").text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
        return None


BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}


def test_mismatched_decode_worker_is_refused_and_ready_says_why():
    with Cluster([info("prefill")], [info("decode", block_size="64", drafter="/m/other")]) as c:
        response = c.ready()
        completion = httpx.post(c.url + "/v1/completions", json=BODY)
        refusals = {
            f: c.metric("pdspec_proxy_pairing_refusals_total", pool="decode", field=f)
            for f in ("block_size", "drafter")
        }
        refused_gauge = c.metric("pdspec_proxy_refused_workers", pool="decode")
        prefill_url, decode_url = c.servers[0].url, c.servers[1].url
    assert response.status_code == 503
    body = response.json()
    assert body["healthy_workers"] == {"prefill": 1, "decode": 0}
    assert body["pairing"]["refused"] == [
        {
            "pool": "decode",
            "worker": decode_url,
            "against": f"prefill worker {prefill_url}",
            "fields": {
                "drafter": {"worker": "/m/other", "reference": "/m/eagle3"},
                "block_size": {"worker": "64", "reference": "128"},
            },
        }
    ]
    assert decode_url in body["reason"] and prefill_url in body["reason"] and "block_size" in body["reason"]
    assert body["pairing"]["reference"]["block_size"] == "128"
    assert completion.status_code == 503
    assert c.behaviours[1].received == []  # nothing reached the refused worker
    assert refusals == {"block_size": 1.0, "drafter": 1.0}
    assert refused_gauge == 1.0


def test_requests_avoid_the_refused_one_of_two_decode_workers():
    with Cluster(
        [info("prefill")], [info("decode"), info("decode", method="dflash")], routing={"decode_policy": "round_robin"}
    ) as c:
        body = c.wait_ready(200)
        statuses = [httpx.post(c.url + "/v1/completions", json=BODY).status_code for _ in range(6)]
    assert statuses == [200] * 6
    good, refused = c.behaviours[1], c.behaviours[2]
    assert len(good.received) == 6 and refused.received == []
    assert [r["fields"] for r in body["pairing"]["refused"]] == [
        {"method": {"worker": "dflash", "reference": "eagle3"}}
    ]


def test_worker_that_rejoins_with_another_config_is_refused_then_back_when_fixed():
    with Cluster(
        [info("prefill")], [info("decode")], health={"eject_after_failures": 1, "readmit_after_successes": 1}
    ) as c:
        c.wait_ready(200)
        decode = c.behaviours[1]
        decode.healthy = False  # restarting...
        c.wait_ready(503)
        decode.worker_info = info("decode", block_size="64")  # ...with another block size
        decode.healthy = True
        deadline = time.monotonic() + 10
        while not c.ready().json()["pairing"]["refused"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)  # poll interval
        body = c.ready().json()
        decode.healthy = False  # fixed and restarted again
        c.wait_ready(503)
        decode.worker_info = info("decode")
        decode.healthy = True
        c.wait_ready(200)
        statuses = [httpx.post(c.url + "/v1/completions", json=BODY).status_code for _ in range(2)]
    assert body["ready"] is False
    assert body["pairing"]["refused"][0]["fields"] == {"block_size": {"worker": "64", "reference": "128"}}
    assert statuses == [200, 200]


def test_info_is_read_again_only_every_interval():
    with Cluster([info("prefill")], [info("decode")], health={"worker_info_interval_s": 0.5}) as c:
        c.wait_ready(200)
        reads_at_start = c.behaviours[1].metrics_reads
        c.behaviours[1].worker_info = info("decode", model="/m/other")  # changed without a failed check
        deadline = time.monotonic() + 10
        while c.ready().status_code != 503:
            assert time.monotonic() < deadline
            time.sleep(0.02)  # poll interval
        checks_meanwhile = 0.5 / 0.05
    assert reads_at_start == 1
    assert c.behaviours[1].metrics_reads <= 3 < checks_meanwhile  # not at every health check


@pytest.mark.parametrize("setting, status", [("admit", 200), ("refuse", 503)])
def test_plain_vllm_worker_is_admitted_or_refused_by_setting(setting, status):
    with Cluster([info("prefill")], [None], health={"unverified_workers": setting}) as c:
        body = c.wait_ready(status)
    if setting == "admit":
        assert body["pairing"]["unverified"] == [{"pool": "decode", "worker": c.servers[1].url}]
    else:
        assert body["pairing"]["refused"][0]["fields"] == {"worker_info": {"worker": "absent", "reference": "required"}}


def test_unreadable_metrics_keep_a_new_worker_out_until_read():
    cluster = Cluster([info("prefill")], [info("decode")])
    decode = cluster.behaviours[1]
    decode.metrics_status = 500
    with cluster as c:
        body = c.ready().json()
        decode.metrics_status = 200
        c.wait_ready(200)
    assert body["pairing"]["pending"] == [
        {"pool": "decode", "worker": c.servers[1].url, "error": "/metrics answered 500"}
    ]
    assert "waiting for its pdspec_worker_info" in body["reason"]


def test_expected_config_setting_through_the_app():
    with Cluster([info("prefill")], [info("decode")], health={"expected_worker_config": {"block_size": 64}}) as c:
        body = c.ready().json()
    assert body["ready"] is False
    assert {r["against"] for r in body["pairing"]["refused"]} == {EXPECTED}
