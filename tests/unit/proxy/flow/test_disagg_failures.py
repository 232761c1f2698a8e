"""Failure policies, backpressure, API keys, the KV-source allowlist and client
disconnects, against stand-in workers."""

import asyncio
import threading

import httpx
import pytest

from tests.proxy_cluster import BODY, Cluster, sample
from tests.standin import StandinBehaviour


def prefill_legs(b: StandinBehaviour) -> int:
    return sum(1 for body in b.received if (body.get("kv_transfer_params") or {}).get("do_remote_decode"))


def test_retry_moves_the_prefill_to_another_worker():
    with Cluster(retries={"prefill_failure_policy": "retry"}) as c:
        c.p1.prefill_status = c.p2.prefill_status = 200
        c.p1.prefill_status = 500
        statuses = [httpx.post(c.url + "/v1/completions", json=BODY).status_code for _ in range(4)]
        metrics = httpx.get(c.url + "/metrics").text
    assert statuses == [200] * 4
    assert prefill_legs(c.p2) == 4
    ok, retried_ok = (
        sample(metrics, f'pdspec_proxy_prefill_outcomes_total{{outcome="{o}"}}') for o in ("ok", "retried_ok")
    )
    assert retried_ok >= 1 and ok + retried_ok == 4, (ok, retried_ok)


def test_error_policy_returns_the_failure():
    with Cluster(retries={"prefill_failure_policy": "error"}) as c:
        c.p1.prefill_status = c.p2.prefill_status = 500
        response = httpx.post(c.url + "/v1/completions", json=BODY)
    assert response.status_code == 502 and response.json()["error"]["type"] == "server_error"
    assert c.d.received == []


def test_fallback_policy_decodes_without_kv_params():
    with Cluster(retries={"prefill_failure_policy": "fallback"}) as c:
        c.p1.prefill_status = c.p2.prefill_status = 500
        response = httpx.post(c.url + "/v1/completions", json=BODY)
        metrics = httpx.get(c.url + "/metrics").text
    assert response.status_code == 200
    assert c.d.received[-1]["kv_transfer_params"] is None
    assert 'pdspec_proxy_prefill_outcomes_total{outcome="fallback"} 1.0' in metrics


def test_every_prefill_outcome_is_exported_at_zero_before_any_request():
    # A rate needs a first sample: a fallback series born at its first increment would
    # hide a burst of fallbacks within one scrape from the fallback alert.
    with Cluster() as c:
        metrics = httpx.get(c.url + "/metrics").text
    for outcome in ("ok", "retried_ok", "fallback", "error"):
        assert sample(metrics, f'pdspec_proxy_prefill_outcomes_total{{outcome="{outcome}"}}') == 0, outcome


@pytest.mark.parametrize(
    "host, port, fragment",
    [
        ("169.254.169.254", 5600, "not its own"),
        (None, 5600, "not its own"),  # no host: the decode side would pick one itself
        ("", 5600, "not its own"),
        (["127.0.0.1"], 5600, "not its own"),
        ("127.0.0.1", None, "outside kv_transfer.source_ports"),
        ("127.0.0.1", 22, "outside kv_transfer.source_ports"),
        ("127.0.0.1", 5664, "outside kv_transfer.source_ports"),
        ("127.0.0.1", "5600", "outside kv_transfer.source_ports"),
        ("127.0.0.1", True, "outside kv_transfer.source_ports"),
        ("127.0.0.1", 5600.0, "outside kv_transfer.source_ports"),
    ],
)
def test_prefill_naming_a_foreign_kv_source_is_refused(host, port, fragment):
    with Cluster(retries={"prefill_failure_policy": "error"}) as c:
        c.p1.remote_host = c.p2.remote_host = host
        c.p1.remote_port = c.p2.remote_port = port
        response = httpx.post(c.url + "/v1/completions", json=BODY)
    assert response.status_code == 502
    assert fragment in response.json()["error"]["message"]
    assert c.d.received == []


def test_kv_source_must_be_the_answering_prefill_worker():
    """Both prefill workers are in the pool, but each may only name itself: p1 naming
    p2's address (here 127.0.0.2 stands for another pool member) is refused."""
    with Cluster(retries={"prefill_failure_policy": "error"}, routing={"prefill_policy": "round_robin"}) as c:
        c.p1.remote_host = c.p2.remote_host = "127.0.0.2"
        c.app.state.pools[0].workers.append(type(c.app.state.pools[0].workers[0])("http://127.0.0.2:9", healthy=False))
        response = httpx.post(c.url + "/v1/completions", json=BODY)
    assert response.status_code == 502 and "not its own" in response.json()["error"]["message"]


def test_kv_source_hosts_and_ports_can_be_widened():
    with Cluster(kv_transfer={"source_hosts": ["10.0.0.7"], "source_ports": ["7000-7010", "7100"]}) as c:
        c.p1.remote_host = c.p2.remote_host = "10.0.0.7"
        statuses = []
        for port in (7000, 7010, 7100, 5600):
            c.p1.remote_port = c.p2.remote_port = port
            statuses.append(httpx.post(c.url + "/v1/completions", json=BODY).status_code)
    assert statuses == [200, 200, 200, 502]


def test_backpressure_answers_429_with_retry_after():
    with Cluster(admission={"max_inflight": 1, "max_queue": 0}) as c:
        c.d.delay_s = 3.0  # long enough for a loaded machine to send the second request meanwhile
        results = {}

        def slow():
            results["slow"] = httpx.post(c.url + "/v1/completions", json=BODY, timeout=10).status_code

        thread = threading.Thread(target=slow)
        thread.start()
        while not c.d.headers:  # the first request holds the only slot once it reaches decode
            pass
        rejected = httpx.post(c.url + "/v1/completions", json=BODY)
        thread.join()
    assert rejected.status_code == 429
    assert rejected.headers["retry-after"] == "1"
    assert rejected.json()["error"]["type"] == "rate_limit_error"
    assert results["slow"] == 200


@pytest.mark.parametrize("header, status", [(None, 401), ("Bearer wrong", 401), ("Basic abc", 401), ("Bearer k1", 200)])
def test_api_keys(header, status):
    with Cluster(clients={"api_keys": ["k1", "k2"]}, worker_client={"api_key": "worker-secret"}) as c:
        headers = {"Authorization": header} if header else {}
        response = httpx.post(c.url + "/v1/completions", json=BODY, headers=headers)
    assert response.status_code == status
    if status == 200:
        # Workers see the proxy's own credential, never the client's key.
        assert {h["authorization"] for h in c.p1.headers + c.p2.headers + c.d.headers} == {"Bearer worker-secret"}
    else:
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert c.d.received == []


@pytest.mark.parametrize("keys, status", [(["k1"], 404), ([], 200)])
def test_api_docs_are_off_when_api_keys_are_set(keys, status):
    with Cluster(clients={"api_keys": keys}) as c:
        for path in ("/docs", "/redoc", "/openapi.json"):
            for headers in ({}, {"Authorization": "Bearer k1"}):
                assert httpx.get(c.url + path, headers=headers).status_code == status, (path, headers)


def test_ready_follows_worker_health():
    with Cluster(health={"interval_s": 0.05, "eject_after_failures": 1, "readmit_after_successes": 1}) as c:
        assert httpx.get(c.url + "/ready").status_code == 200
        c.d.healthy = False
        while httpx.get(c.url + "/ready").status_code != 503:  # health checks run every 50 ms
            pass
        body = httpx.get(c.url + "/ready").json()
        c.d.healthy = True
        while httpx.get(c.url + "/ready").status_code != 200:
            pass
    assert (body["ready"], body["healthy_workers"]) == (False, {"prefill": 2, "decode": 0})
    assert body["reason"] == "no admitted decode worker"


def test_client_disconnect_during_prefill_cancels_the_leg():
    async def go(url):
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(url + "/v1/completions", json=BODY, timeout=0.3)

    with Cluster() as c:
        c.p1.delay_s = c.p2.delay_s = 5.0
        asyncio.run(go(c.url))
        for _ in range(200):  # the proxy closes the prefill connection once the client is gone
            if c.p1.cancelled + c.p2.cancelled:
                break
            asyncio.run(asyncio.sleep(0.02))
    assert c.p1.cancelled + c.p2.cancelled == 1
    assert c.d.received == []


def test_client_gone_between_the_legs_gets_its_prefill_kv_released():
    """The decode worker cannot be reached, and the client leaves during the retry backoff:
    no decode worker got the request, so the proxy sends a one-token decode with the same
    KV params, which makes a real decode worker read (and so free) the KV."""
    with Cluster(retries={"decode_retries": 1, "backoff_s": 1.0}, health={"interval_s": 60}) as c:
        c.servers[2].__exit__(None, None, None)  # the decode worker is gone
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(c.url + "/v1/completions", json={**BODY, "stream": True}, timeout=0.3)
        for _ in range(300):
            if "pdspec_proxy_kv_releases_total{" in (metrics := httpx.get(c.url + "/metrics").text):
                break
            asyncio.run(asyncio.sleep(0.02))
    assert 'pdspec_proxy_kv_releases_total{outcome="connect_error",reason="client_gone"} 1.0' in metrics


def test_no_release_when_the_decode_worker_holds_the_request():
    with Cluster() as c:
        c.d.delay_s = 5.0
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(c.url + "/v1/completions", json=BODY, timeout=0.5)
        for _ in range(200):  # the decode worker sees its caller leave, and aborts
            if c.d.cancelled:
                break
            asyncio.run(asyncio.sleep(0.02))
        metrics = httpx.get(c.url + "/metrics").text
    assert c.d.cancelled == 1 and len(c.d.received) == 1
    assert "pdspec_proxy_kv_releases_total{" not in metrics
