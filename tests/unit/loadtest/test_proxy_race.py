"""The proxy race's pure parts: the schedule and its round order, the workload, both
contenders' command lines and settings, the reply check and the per-run accounting."""

import json
from collections import Counter, namedtuple

import pytest
from pydantic import ValidationError

from loadtest.micro.instant_worker import token_ids
from loadtest.micro.proxy_race import (
    CONTENDERS,
    PAIRINGS,
    Ports,
    busy_shares,
    check_reply,
    chosen,
    cpu_list,
    pdspec_command,
    pdspec_settings,
    per_request,
    prompts,
    request_bodies,
    round_order,
    router_argv,
    schedule,
)
from pdspec.settings import ProxySettings


def test_the_order_alternates_between_rounds():
    assert round_order(("pdspec", "vllm-router"), 0) == ["pdspec", "vllm-router"]
    assert round_order(("pdspec", "vllm-router"), 1) == ["vllm-router", "pdspec"]
    assert round_order(("pdspec", "vllm-router"), 2) == round_order(("pdspec", "vllm-router"), 0)


def test_every_point_runs_every_contender_once_a_round_rounds_outermost():
    runs = schedule(3, ["round_robin", "kv_aware"], ["whole", "stream"], [1, 8, 64, 256])
    assert len(runs) == 3 * 2 * 2 * 4 * len(CONTENDERS)
    per_point_round = Counter((r.round, r.pairing, r.shape, r.connections, r.contender) for r in runs)
    assert set(per_point_round.values()) == {1}
    assert [r.round for r in runs] == sorted(r.round for r in runs)  # a round ends before the next begins
    for round_index in range(3):
        point = [
            r.contender
            for r in runs
            if r.round == round_index and (r.pairing, r.shape, r.connections) == ("kv_aware", "stream", 64)
        ]
        assert point == round_order(CONTENDERS, round_index)  # the pair runs back to back, in that round's order
    first = next(i for i, r in enumerate(runs) if r.round == 0 and r.connections == 8)
    assert runs[first].contender != runs[first + 1].contender


def test_prompts_are_seeded_distinct_and_as_long_as_asked():
    texts = prompts(4, 2000, seed=1)
    assert texts == prompts(4, 2000, seed=1) and texts != prompts(4, 2000, seed=2)
    assert len(set(texts)) == 4
    assert all(len(token_ids(text)) == 2000 for text in texts)  # the instant worker's tokens


def test_the_bodies_differ_only_in_the_stream_flag():
    whole, streamed = (request_bodies(["a b"], flag, 64)[0] for flag in (False, True))
    assert json.loads(whole) == {"model": "bench", "prompt": "a b", "max_tokens": 64, "stream": False}
    assert json.loads(streamed) == {**json.loads(whole), "stream": True}


def test_pdspec_runs_its_defaults_but_for_workers_port_and_the_pairings_policies():
    settings = pdspec_settings(PAIRINGS["kv_aware"], 31410, "http://127.0.0.1:31401", "http://127.0.0.1:31402")
    parsed = ProxySettings.model_validate(settings)
    assert parsed.port == 31410
    assert parsed.prefill_urls == ["http://127.0.0.1:31401"] and parsed.decode_urls == ["http://127.0.0.1:31402"]
    assert (parsed.routing.prefill_policy, parsed.routing.decode_policy) == ("kv_aware", "kv_aware")
    defaults = ProxySettings()
    assert parsed.admission == defaults.admission and parsed.observability == defaults.observability
    argv, env = pdspec_command(settings)
    assert argv[1:] == ["-m", "pdspec.cli", "proxy"] and json.loads(env["PDSPEC_PROXY"]) == settings


def test_overrides_reach_their_group_and_a_wrong_key_fails_before_any_process_starts():
    overrides = {"routing.tokenize_timeout_s": 1.5, "admission.max_inflight": 512}
    settings = pdspec_settings(PAIRINGS["kv_aware"], 1, "http://a:1", "http://b:2", overrides)
    parsed = ProxySettings.model_validate(settings)
    assert parsed.routing.tokenize_timeout_s == 1.5 and parsed.routing.prefill_policy == "kv_aware"
    assert parsed.admission.max_inflight == 512
    assert PAIRINGS["kv_aware"].pdspec == {"routing": {"prefill_policy": "kv_aware", "decode_policy": "kv_aware"}}
    with pytest.raises(ValidationError):
        pdspec_settings(PAIRINGS["round_robin"], 1, "http://a:1", "http://b:2", {"routing.no_such_key": 1})


def test_the_router_runs_pd_mode_with_the_pairings_policy_on_its_own_ports():
    argv = router_argv("/r/bin/vllm-router", PAIRINGS["kv_aware"], 31411, "http://p:1", "http://d:2", 31450)

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert argv[0] == "/r/bin/vllm-router" and "--vllm-pd-disaggregation" in argv
    assert value("--policy") == "cache_aware" and value("--port") == "31411"
    assert value("--prefill") == "http://p:1" and value("--decode") == "http://d:2"
    assert value("--prometheus-port") == "31450"  # its default, 29000, is outside the race's ports
    assert value("--host") == "127.0.0.1" and value("--prometheus-host") == "127.0.0.1"
    round_robin = router_argv("r", PAIRINGS["round_robin"], 1, "http://p:1", "http://d:2", 2)
    assert round_robin[round_robin.index("--policy") + 1] == "round_robin"


def test_every_process_of_the_race_has_a_port_of_its_own():
    ports = Ports(31400, ["round_robin", "kv_aware"])
    taken = [ports.prefill, ports.decode]
    taken += [ports.proxy(p, c) for p in ports.pairings for c in CONTENDERS]
    taken += [ports.router_metrics(p) for p in ports.pairings]
    assert len(set(taken)) == len(taken) and all(31400 < port < 31470 for port in taken)


def test_chosen_names_are_checked():
    assert chosen("stream, whole", {"whole": 0, "stream": 1}, "--shapes") == ["stream", "whole"]
    with pytest.raises(SystemExit, match="--shapes: unknown"):
        chosen("whole,streamed", {"whole": 0, "stream": 1}, "--shapes")


def stream(tokens: int, done: bool = True) -> bytes:
    events = [json.dumps({"choices": [{"index": 0, "text": f" t{i}"}]}) for i in range(tokens)]
    return "".join(f"data: {e}\n\n" for e in events + (["[DONE]"] if done else [])).encode()


def test_a_reply_that_is_not_the_workers_is_named():
    whole = json.dumps({"choices": [{"text": " hello world"}]}).encode()
    assert check_reply(200, whole, False, 64) is None
    assert "not the worker's" in check_reply(200, json.dumps({"choices": [{"text": "x"}]}).encode(), False, 64)
    assert "status 502" in check_reply(502, b"bad gateway", False, 64)
    assert check_reply(200, stream(64), True, 64) is None
    assert "63 token events" in check_reply(200, stream(63), True, 64)
    assert "[DONE]" in check_reply(200, stream(64, done=False), True, 64)
    assert "not JSON" in check_reply(200, b"data: {oops\n\ndata: [DONE]\n\n", True, 64)


def test_worker_calls_are_posts_per_completed_request():
    before = {"prefill": 10, "decode": 0, "decode_stream": 10, "tokenize": 3, "other": 5, "stats": 2, "metrics": 1}
    after = {"prefill": 110, "decode": 0, "decode_stream": 110, "tokenize": 103, "other": 9, "stats": 3, "metrics": 2}
    assert per_request(before, after, 100) == {"prefill": 1.0, "decode_stream": 1.0, "tokenize": 1.0}
    assert per_request(before, after, 0) == {}  # no request completed: nothing to divide by


Times = namedtuple("Times", "user nice system idle iowait")


def test_busy_share_of_chosen_cores():
    before = [Times(0, 0, 0, 0, 0), Times(0, 0, 0, 0, 0)]
    after = [Times(3, 0, 1, 4, 2), Times(9, 0, 1, 0, 0)]  # core 0: 4 busy of 10; core 1: all busy
    assert busy_shares(before, after, [0]) == 0.4
    assert busy_shares(before, after, [1]) == 1.0
    assert busy_shares(before, after, [0, 1]) == 0.7
    assert busy_shares(before, after, [5]) is None  # a core this machine lacks


def test_taskset_lists_as_cpu_numbers():
    assert cpu_list("1") == [1] and cpu_list("0,2") == [0, 2] and cpu_list("0-3,6") == [0, 1, 2, 3, 6]


def test_each_pairing_has_its_prompt_length_unless_one_is_given():
    from loadtest.micro.proxy_race import prompt_tokens_of

    assert (prompt_tokens_of("round_robin", None), prompt_tokens_of("kv_aware", None)) == (8, 2000)
    assert prompt_tokens_of("round_robin", 300) == prompt_tokens_of("kv_aware", 300) == 300


def test_the_report_names_each_pairings_prompt_length():
    from loadtest.micro.proxy_race_report import prompt_words

    assert prompt_words(2000) == "2,000"
    assert prompt_words({"round_robin": 8, "kv_aware": 2000}) == "8 (round_robin), 2,000 (kv_aware)"
