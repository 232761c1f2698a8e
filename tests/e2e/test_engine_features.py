"""Every engine feature reports whether it is on, on the stack `make run` starts (issue 22):
the KV-only drafter pass is on in the P/D prefill worker (it was off there, behind a
connector check that never matched vLLM's real class), and it writes the drafter KV of
every K=0 step."""

from __future__ import annotations

import pytest

from pdspec.worker.engine.in_core_worker import NO_QUEUE
from tests import harness
from tests.prompts import completion_body, unique_prompt

ON_IN_MAKE_RUN = {
    "prefill": {
        "k0_rule",
        "kv_only_pass",
        "nixl_progress_delay",
        "kv_core_pinning",
        "kv_hold_wait",
        "prefill_reply_guard",
        "cpu_expand_fix",
        "in_core_worker",
    },
    "decode": {
        "k0_rule",
        "nixl_progress_delay",
        "kv_core_pinning",
        "stale_kv_guard",
        "cpu_expand_fix",
        "in_core_worker",
    },
}
# The features that cannot be on here, and why: short_spin bounds the spin of a queue that
# a one-process engine whose model runs in its engine core (in_core_worker) does not have.
OFF_IN_MAKE_RUN = {
    "prefill": {"dp_idle_rank_vote": "vLLM's V2 runner, where ranks vote, runs on GPUs only", "short_spin": NO_QUEUE},
    "decode": {"short_spin": NO_QUEUE},
}


def feature_states(url: str) -> dict[str, tuple[str, str]]:
    samples = harness.scrape_labeled(url, "pdspec_engine_feature")
    states = {}
    for labels, value in samples.items():
        labels = dict(labels)
        if value == 1:
            states[labels["feature"]] = (labels["state"], labels["reason"])
    return states


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_every_feature_that_should_be_on_is_on(stack, client, role):
    url = stack.prefill_url if role == "prefill" else stack.decode_url
    states = feature_states(url)
    assert {name for name, (state, _) in states.items() if state == "on"} == ON_IN_MAKE_RUN[role], states
    assert {name: reason for name, (state, reason) in states.items() if state == "off"} == OFF_IN_MAKE_RUN[role]


def test_the_kv_only_pass_writes_the_drafter_kv_of_every_k0_step(stack, client):
    before = harness.scrape(stack.prefill_url)
    for i in range(3):
        body = completion_body(unique_prompt(60 + 40 * i), max_tokens=8)
        assert client.post(stack.proxy_url + "/v1/completions", json=body).status_code == 200
    after = harness.scrape(stack.prefill_url)
    k0 = after["pdspec_k0_proposals_total"] - before["pdspec_k0_proposals_total"]
    passes = after["pdspec_kv_only_passes_total"] - before["pdspec_kv_only_passes_total"]
    assert k0 >= 3 and passes == k0


def test_ready_shows_the_features_that_are_off(stack, client):
    body = client.get(stack.proxy_url + "/ready").json()
    urls = {"prefill": stack.prefill_url, "decode": stack.decode_url}
    listed = sorted(body["engine_features_off"], key=lambda entry: (entry["pool"], entry["feature"]))
    assert listed == [
        {"pool": role, "worker": urls[role], "feature": name, "reason": reason}
        for role in ("decode", "prefill")
        for name, reason in sorted(OFF_IN_MAKE_RUN[role].items())
    ]
