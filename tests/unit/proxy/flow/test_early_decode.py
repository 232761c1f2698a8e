"""Early decode (proxy/flow/early_decode.py) against stand-in workers: the decode leg goes out
with the prefill leg once the prefill worker is known to push, never otherwise; a prefill
worker that comes back as another engine, a failed prefill and a client that leaves each
settle the early leg so that the decode worker's registered blocks are freed.
(tests/e2e/test_kv_push.py runs it on real workers.)"""

from __future__ import annotations

import httpx
import pytest

from pdspec.settings import ProxySettings
from proxy.fleet.health import HealthChecker
from proxy.fleet.pool import WorkerPool
from proxy.flow.early_decode import early_params, kv_source, same_source
from tests import harness
from tests.proxy_cluster import Cluster, Fleet, outstanding, queued_prefill_s, sample
from tests.standin import decode_legs

BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}
PUSHED = {
    "remote_engine_id": "e1",
    "remote_host": "10.0.0.1",
    "remote_port": 5600,
    "tp_size": 1,
    "pp_size": 1,
    "dcp_size": 1,
    "transfer_mode": "push",
    "remote_block_ids": [[3, 4]],
    "remote_request_id": "cmpl-a-0-1f2e3d4c",
    "remote_num_tokens": 20,
    "do_remote_prefill": True,
    "do_remote_decode": False,
}


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    return harness.wait_for(condition, timeout_s, poll_s=0.02)


def decode_params(behaviour) -> list[dict]:
    """The kv_transfer_params of every decode leg a stand-in got, in order."""
    return [b.get("kv_transfer_params") or {} for b in decode_legs(behaviour)]


def prefill_ids(behaviour) -> list[str]:
    return [
        h.get("x-request-id")
        for b, h in zip(behaviour.received, behaviour.headers, strict=True)
        if (b.get("kv_transfer_params") or {}).get("do_remote_decode")
    ]


def outcomes(url: str) -> dict[str, float]:
    metrics = httpx.get(url + "/metrics").text
    names = ("used", "stale_source", "prefill_failed", "client_gone", "completed", "not_completed")
    return {name: sample(metrics, f'pdspec_proxy_early_decodes_total{{outcome="{name}"}}') for name in names}


# --- the parameters ------------------------------------------------------------------


def test_the_source_of_a_pushed_kv_is_what_every_reply_of_that_engine_shares():
    source = kv_source(PUSHED)
    assert source == {
        "remote_engine_id": "e1",
        "remote_host": "10.0.0.1",
        "remote_port": 5600,
        "tp_size": 1,
        "pp_size": 1,
        "dcp_size": 1,
        "transfer_mode": "push",
    }
    assert kv_source({**PUSHED, "transfer_mode": "pull"}) is None
    assert kv_source({k: v for k, v in PUSHED.items() if k != "transfer_mode"}) is None  # vLLM before push


def test_early_params_register_the_decode_blocks_without_naming_prefill_blocks():
    params = early_params(kv_source(PUSHED), "req-7")
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_block_ids"] == [] and params["remote_request_id"] == "req-7"
    assert params["remote_engine_id"] == "e1" and params["remote_port"] == 5600


def test_a_reply_from_another_engine_or_side_channel_is_another_source():
    source = kv_source(PUSHED)
    assert same_source(source, {**PUSHED, "remote_block_ids": [[9]], "remote_request_id": "other"})
    assert not same_source(source, {**PUSHED, "remote_engine_id": "e2"})
    assert not same_source(source, {**PUSHED, "remote_port": 5601})


def test_an_ejected_worker_forgets_its_kv_source():
    pool = WorkerPool.from_urls("prefill", ["http://10.0.0.1:8100"])
    worker = pool.workers[0]
    worker.kv_source = kv_source(PUSHED)
    checker = HealthChecker(None, [pool], interval_s=1, timeout_s=1, eject_after=1, readmit_after=1)
    checker.record(pool, worker, ok=False)
    assert not worker.healthy and worker.kv_source is None


def test_early_decode_is_off_by_default():
    assert ProxySettings().kv_transfer.early_decode is False


# --- through the proxy -----------------------------------------------------------------


def push_fleet(decode: int = 1, **settings) -> Fleet:
    fleet = Fleet(1, decode, None, {"kv_transfer": {"early_decode": True}, "retries": {"backoff_s": 0.01}}, **settings)
    fleet.prefills[0].transfer_mode = "push"
    return fleet


def test_the_decode_leg_goes_out_with_the_prefill_once_the_worker_is_known_to_push():
    with push_fleet() as f:
        (prefill,), (decode,) = f.prefills, f.decodes
        prefill.delay_s = 0.5  # the prefill takes a while
        for _ in range(2):
            assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        counts = outcomes(f.url)
    first, second = decode_params(decode)
    # The first request learns where the KV comes from, so it goes the usual way.
    assert first["remote_block_ids"] == [[1]]
    assert second["remote_block_ids"] == [] and second["do_remote_prefill"] is True
    assert second["remote_engine_id"] == "standin" and second["transfer_mode"] == "push"
    # The early leg reached the decode worker while the prefill was still running.
    prefill_arrived, decode_arrived = prefill.received_at[1], decode.received_at[1]
    assert decode_arrived < prefill_arrived + prefill.delay_s
    assert counts["used"] == 1 and counts["stale_source"] == 0


@pytest.mark.parametrize(
    "settings", [{"kv_transfer": {"early_decode": False}}, {}], ids=["setting_off", "worker_pulls"]
)
def test_no_early_leg_when_off_or_when_the_worker_pulls(settings):
    fleet = Fleet(prefill=1, decode=1, **settings)
    if settings:  # setting off, worker pushes
        fleet.prefills[0].transfer_mode = "push"
    with fleet as f:
        for _ in range(3):
            assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        metrics = httpx.get(f.url + "/metrics").text
    assert [p["remote_block_ids"] for p in decode_params(f.decodes[0])] == [[[1]], [[2]], [[3]]]
    assert "pdspec_proxy_early_decodes_total{" not in metrics


def test_a_prefill_worker_answering_as_another_engine_gets_the_usual_decode_leg():
    """It restarted between two health checks: the early leg registered with the engine
    that is gone (vLLM's handshake fails there and frees the blocks), so the request goes on
    with the new engine's reply, and the next one goes early to the new engine."""
    with push_fleet() as f:
        (prefill,), (decode,) = f.prefills, f.decodes
        assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        prefill.engine_id = "restarted"
        for _ in range(2):
            assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        counts = outcomes(f.url)
    legs = decode_params(decode)
    assert [(p["remote_engine_id"], p["remote_block_ids"]) for p in legs] == [
        ("standin", [[1]]),
        ("standin", []),
        ("restarted", [[2]]),
        ("restarted", []),
    ]
    assert counts["stale_source"] == 1 and counts["used"] == 1


def test_a_failed_prefill_is_completed_on_its_worker_so_the_decode_blocks_are_written():
    """The early leg registered blocks with the first prefill worker: that worker must end
    a prefill of this request id before the decode worker frees them. The request itself
    goes on with a retry on the other prefill worker."""
    with Cluster(kv_transfer={"early_decode": True}, retries={"prefill_retries": 1}) as c:
        c.p1.transfer_mode = c.p2.transfer_mode = "push"
        for _ in range(2):  # round robin: both prefill workers are known to push
            assert httpx.post(c.url + "/v1/completions", json=BODY).status_code == 200
        c.p1.fail_prefills = 1
        response = httpx.post(c.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "failed-once"})
        assert response.status_code == 200, response.text
        assert wait_for(lambda: outcomes(c.url)["completed"] == 1)
        counts = outcomes(c.url)
    assert prefill_ids(c.p1).count("failed-once") == 2  # the failed leg, then the completing one
    assert prefill_ids(c.p2).count("failed-once") == 1  # the retry
    assert counts["prefill_failed"] == 1 and counts["not_completed"] == 0


def test_a_client_leaving_during_the_prefill_lets_it_end_and_closes_the_early_leg():
    with push_fleet() as f:
        (prefill,) = f.prefills
        assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        prefill.delay_s = 1.0
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f.url + "/v1/completions", json=BODY, timeout=0.3)
        assert wait_for(lambda: prefill.prefills == 2)  # it ran to its end: its WRITE frees the blocks
        assert wait_for(lambda: outstanding(f) == [0, 0])
        counts = outcomes(f.url)
    assert prefill.cancelled == 0
    assert counts["client_gone"] == 1 and counts["used"] == 0 and counts["completed"] == 0


def test_a_prefill_that_answered_but_failed_the_proxy_check_is_not_run_again():
    """The worker ended that prefill (it WRITEs the KV to the early leg's blocks): a second
    one would hold KV that no decode leg registers for."""
    with push_fleet(retries={"prefill_failure_policy": "error"}) as f:
        (prefill,) = f.prefills
        assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        prefill.remote_port = 1  # outside kv_transfer.source_ports
        response = httpx.post(f.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "answered"})
        assert response.status_code == 502
        assert wait_for(lambda: outcomes(f.url)["prefill_failed"] == 1)
        counts = outcomes(f.url)
    assert prefill_ids(prefill).count("answered") == 1
    assert counts["completed"] == 0 and counts["not_completed"] == 0


def test_a_decode_retry_after_a_failed_early_leg_prefills_again_without_another_early_leg():
    """The early leg went on the wire and failed: the retry gets KV of its own, and its
    decode leg goes the usual way (one more early leg would be a second decode leg for
    that KV, opened by nobody's request)."""
    with push_fleet(decode=2, routing={"decode_policy": "round_robin"}, retries={"decode_retries": 1}) as f:
        (prefill,), (first, second) = f.prefills, f.decodes
        assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200  # learns; decoded by `first`
        second.fail_decodes = 1  # round robin: the next early leg goes to `second`
        response = httpx.post(f.url + "/v1/completions", json=BODY)
        assert response.status_code == 200, response.text
        assert wait_for(lambda: outstanding(f) == [0, 0, 0])
        metrics = httpx.get(f.url + "/metrics").text
    assert [p["remote_block_ids"] for p in decode_params(second)] == [[]]  # the early leg, refused
    assert [p["remote_block_ids"] for p in decode_params(first)] == [[[1]], [[3]]]  # the retry: a third prefill
    assert prefill.prefills == 3
    assert sample(metrics, 'pdspec_proxy_kv_reprefills_total{reason="http_5xx"}') == 1.0
    assert "pdspec_proxy_kv_releases_total{" not in metrics


def test_a_used_early_leg_whose_reply_breaks_gets_no_release():
    """The early leg got the KV (the prefill worker WRITEs it there): a release leg would be
    a second decode leg for it."""
    with push_fleet(retries={"decode_retries": 0}) as f:
        (decode,) = f.decodes
        assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        decode.truncate_decodes = 1
        assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 502
        metrics = httpx.get(f.url + "/metrics").text
    assert len(decode_params(decode)) == 2
    assert "pdspec_proxy_kv_releases_total{" not in metrics


def test_a_prefill_that_ends_after_its_client_left_is_released_when_the_early_leg_was_refused():
    """Nothing registered for that KV (the decode worker refused the leg): it is released
    as any prefill's whose decode will not come, not left to the worker's lease."""
    with push_fleet() as f:
        (prefill,), (decode,) = f.prefills, f.decodes
        assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        decode.fail_decodes, decode.fail_status = 1, 400
        prefill.delay_s = 1.0
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f.url + "/v1/completions", json=BODY, timeout=0.3)
        assert wait_for(
            lambda: (
                'pdspec_proxy_kv_releases_total{outcome="ok",reason="client_gone"} 1.0'
                in httpx.get(f.url + "/metrics").text
            )
        )
    released = decode_params(decode)[-1]
    assert released["remote_block_ids"] == [[2]]  # the release leg carries the ended prefill's KV


def test_a_refused_prefill_is_not_sent_again():
    """A 4xx: the prefill worker computed nothing, and the decode worker refuses the same body."""
    with push_fleet(retries={"prefill_failure_policy": "error"}) as f:
        (prefill,) = f.prefills
        assert httpx.post(f.url + "/v1/completions", json=BODY).status_code == 200
        prefill.fail_prefills, prefill.fail_status = 1, 400
        response = httpx.post(f.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "refused"})
        assert response.status_code == 400
        counts = outcomes(f.url)
    assert prefill_ids(prefill).count("refused") == 1
    assert counts["prefill_failed"] == 1 and counts["completed"] == 0 and counts["not_completed"] == 0


def test_admission_counts_a_prefill_whose_client_left_until_it_ends():
    """With an early leg the prefill runs on after its client left (it must end): admission
    by KV room and queued time keeps counting it on its worker until then."""
    with push_fleet(admission={"prefill_kv": True, "prefill_kv_read_interval_s": 0.05, "queue_timeout_s": 30}) as f:
        (prefill,) = f.prefills
        prefill.prefill_tokens_per_s = 1000
        body = {**BODY, "prompt": list(range(300))}
        assert httpx.post(f.url + "/v1/completions", json=body, timeout=30).status_code == 200  # learns; the rate
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f.url + "/v1/completions", json={**body, "prompt": list(range(3000))}, timeout=0.5)
        assert prefill.prefills == 1  # still running: 3,000 tokens at 1,000 a second
        assert queued_prefill_s(f) > 0.5
        assert wait_for(lambda: prefill.prefills == 2)
        assert wait_for(lambda: queued_prefill_s(f) == 0.0), queued_prefill_s(f)
        assert wait_for(lambda: outstanding(f) == [0, 0])
