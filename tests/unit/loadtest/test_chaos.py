"""The chaos soak's classifier: which errors nothing could have served, and which are lost."""

import json

import httpx
import pytest

from loadtest.serving.chaos import (
    Fault,
    Record,
    classify,
    error_outcome,
    fault_recovery,
    key,
    markdown,
    reference_texts,
    worker_urls,
)
from proxy.errors import error_body
from tests.standin import StandinBehaviour, ThreadServer, create_standin

PROXY_BOTH = [(10.0, {"prefill": 1, "decode": 1})]  # the proxy still counts one of each healthy


def error(started=10.0, ended=11.0) -> Record:
    return Record(started, ended, "completions", "error", "HTTP 502")


def test_ok_and_left_are_what_they_are():
    assert classify(Record(0, 1, "chat", "ok"), [], []) == "ok"
    assert classify(Record(0, 1, "chat", "left"), [], []) == "left"


def test_an_error_while_a_worker_of_each_role_was_up_is_lost():
    up = [(10.5, {"prefill-0": True, "prefill-1": False, "decode": True})]
    assert classify(error(), [Fault(9.0, "prefill-1", "kill")], PROXY_BOTH, up) == "lost"


def test_an_error_while_every_prefill_worker_was_down_is_clean_though_the_proxy_counted_one():
    # prefill-1 killed a moment ago (the proxy has not noticed), prefill-0 still restarting.
    up = [(10.5, {"prefill-0": False, "prefill-1": False, "decode": True})]
    assert classify(error(), [Fault(9.0, "prefill-1", "kill")], PROXY_BOTH, up) == "failed_clean"


def test_the_proxy_seeing_no_worker_of_a_role_is_clean():
    assert classify(error(), [], [(10.5, {"prefill": 0, "decode": 1})]) == "failed_clean"


def test_a_decode_fault_under_the_request_is_clean_and_one_long_before_is_not():
    up = [(10.5, {"prefill-0": True, "decode": True})]
    assert classify(error(), [Fault(10.2, "decode", "kill")], PROXY_BOTH, up) == "failed_clean"
    assert classify(error(), [Fault(2.0, "decode", "kill")], PROXY_BOTH, up) == "lost"


def test_a_wrong_output_is_lost_whatever_the_health():
    wrong = Record(10.0, 11.0, "chat", "wrong", "text differs")
    assert classify(wrong, [], [(10.5, {"prefill": 0, "decode": 0})]) == "lost"


def test_the_proxys_internal_error_is_a_bug_lost_whatever_the_health():
    """proxy/edge/endpoint.py answers an exception it did not expect with a 500 of this body."""
    internal = json.dumps(error_body(500, "Internal proxy error.")).encode()
    assert error_outcome(500, internal) == "bug"
    bug = Record(10.0, 11.0, "completions", "bug", "HTTP 500")
    assert classify(bug, [], [(10.5, {"prefill": 0, "decode": 0})]) == "lost"
    # A worker's failure relayed as 502/503/504, or a 500 without that code: an error
    # that the fleet's state may excuse.
    for status in (502, 503, 504):
        assert error_outcome(status, json.dumps(error_body(status, "prefill worker failed")).encode()) == "error"
    assert error_outcome(500, b"not json") == "error"
    assert error_outcome(500, json.dumps(error_body(500, "x", code="other")).encode()) == "error"


def test_a_fault_is_recovered_when_its_worker_answers_and_the_pool_is_whole_again():
    fault = Fault(10.0, "prefill-1", "kill")
    up = [
        (9.5, {"prefill-0": True, "prefill-1": True}),
        (10.5, {"prefill-0": True, "prefill-1": False}),
        (70.0, {"prefill-0": True, "prefill-1": True}),
    ]
    health = [
        (9.0, {"prefill": 2, "decode": 1}),
        (12.0, {"prefill": 1, "decode": 1}),
        (71.0, {"prefill": 1, "decode": 1}),
        (74.0, {"prefill": 2, "decode": 1}),
    ]
    assert fault_recovery(fault, up, health) == {"back_s": 60.0, "readmitted_s": 64.0}
    never = [(10.5, {"prefill-0": True, "prefill-1": False})]
    assert fault_recovery(fault, never, health) == {"back_s": None, "readmitted_s": None}


def test_the_table_lists_every_fault_with_its_recovery():
    report = {
        "command": "c",
        "fleet": "2P2D",
        **{
            k: 0
            for k in (
                "requests",
                "ok",
                "failed_clean",
                "lost",
                "left",
                "restarts",
                "readmissions",
                "nixl_bytes_after_last_restart",
                "prefill_kv_blocks_left",
                "proxy_rss_mb_start",
                "proxy_rss_mb_end",
            )
        },
        "faults_recovered": 1,
        "faults": [{"kind": "kill", "worker": "decode", "at": 30.0, "back_s": 61.0, "readmitted_s": 63.5}],
    }
    table = markdown(report)
    assert "| faults_recovered | 1 of 1 |" in table and "| kill | decode | 30.0 | 61.0 | 63.5 |" in table
    assert "| fleet | 2P2D |" in table
    served = markdown(report | {"served_after_restart": {"decode-1": 14.0}})
    assert "| decode-1 | 14 |" in served


def test_a_decode_fault_is_clean_only_for_the_requests_of_the_faulted_worker():
    workers = worker_urls(8600, 2, 2)
    up = [(10.5, {"prefill-0": True, "prefill-1": True, "decode-0": True, "decode-1": True})]
    fault = [Fault(10.2, "decode-1", "kill")]
    on_it = Record(10.0, 11.0, "chat", "error", "error event", decode_worker=workers["decode-1"])
    on_the_other = Record(10.0, 11.0, "chat", "error", "error event", decode_worker=workers["decode-0"])
    unknown = Record(10.0, 11.0, "chat", "error", "HTTP 502")  # no reply headers: any decode fault counts
    assert classify(on_it, fault, PROXY_BOTH, up, workers) == "failed_clean"
    assert classify(on_the_other, fault, PROXY_BOTH, up, workers) == "lost"
    assert classify(unknown, fault, PROXY_BOTH, up, workers) == "failed_clean"


def test_workers_are_named_and_placed_as_pdspec_up_does():
    assert worker_urls(8600, 2, 1) == {
        "prefill-0": "http://127.0.0.1:8700",
        "prefill-1": "http://127.0.0.1:8701",
        "decode": "http://127.0.0.1:8800",
    }
    assert list(worker_urls(8600, 2, 2)) == ["prefill-0", "prefill-1", "decode-0", "decode-1"]


def test_the_fleet_is_whole_when_every_worker_answers_and_every_pool_is_full():
    from loadtest.serving.chaos import whole

    health = [(1.0, {"prefill": 2, "decode": 1}), (2.0, {"prefill": 1, "decode": 1})]
    up = [(2.0, {"prefill-0": True, "prefill-1": True, "decode": True})]
    assert not whole(health, up)  # the proxy has not readmitted the second prefill worker
    assert whole(health + [(3.0, {"prefill": 2, "decode": 1})], up)
    assert not whole(health + [(3.0, {"prefill": 2, "decode": 1})], [(3.0, {"prefill-0": False, "decode": True})])
    assert not whole([], up)


def test_reference_texts_are_each_greedy_bodys_whole_text_and_a_failed_reply_raises():
    bodies = [
        ("completions_stream", {"model": "m", "prompt": "hello", "max_tokens": 4, "stream": True}),
        ("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ]
    behaviour = StandinBehaviour()
    with ThreadServer(create_standin(behaviour)) as server:
        texts = reference_texts(server.url, bodies)
        with httpx.Client() as client:
            expected = {
                key(bodies[0][1]): client.post(
                    server.url + "/v1/completions", json={**bodies[0][1], "stream": False}
                ).json()["choices"][0]["text"],
                key(bodies[1][1]): client.post(server.url + "/v1/chat/completions", json=bodies[1][1]).json()[
                    "choices"
                ][0]["message"]["content"],
            }
        assert texts == expected and all(expected.values())
        assert [body.get("stream") for body in behaviour.received[:2]] == [False, False]  # asked whole
        behaviour.decode_status = 500
        with pytest.raises(httpx.HTTPStatusError):
            reference_texts(server.url, bodies)
