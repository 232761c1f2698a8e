"""`kv_transfer = push` (vLLM's NixlPushConnector: the prefill worker WRITEs the prompt's
KV into blocks the decode worker registered) on a real 1P1D stack: the workers say so in
their info, greedy output equals a colocated server's, the decode worker computes at most
the last prompt token itself, and the prefill worker keeps no KV afterwards. The one-GPU
profile takes push because UCX serves a pull's READ over TCP where GPUs share no NVLink
(0.44 GB/s measured on one H200, loadtest/results/handoff/h200-one-gpu/)."""

import pytest

from tests import harness
from tests.e2e.test_kv_transfer import by_source, scrape_with_sources
from tests.prompts import completion_body, completion_outputs, unique_prompt

PUSH = ["--prefill.kv_transfer", "push", "--decode.kv_transfer", "push"]


@pytest.fixture(scope="module")
def push_stack(tmp_path_factory):
    stack = harness.start_stack(tmp_path_factory.mktemp("push"), 25000, [*harness.TEST_STACK_ARGS, *PUSH])
    yield stack
    stack.stop()


def test_both_workers_report_the_push_connector(push_stack):
    for url in (push_stack.prefill_url, push_stack.decode_url):
        (labels,) = harness.scrape_labeled(url, "pdspec_worker_info")
        assert dict(labels)["kv_connector"] == "push", url


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_pushed_kv_gives_the_colocated_output(push_stack, reference_outputs, client, stream):
    assert completion_outputs(client, push_stack.proxy_url, stream) == reference_outputs["completions"]


def test_the_decode_worker_receives_the_prompt_rather_than_computing_it(push_stack, client):
    before = scrape_with_sources(push_stack.decode_url)
    response = client.post(push_stack.proxy_url + "/v1/completions", json=completion_body(unique_prompt(400)))
    assert response.status_code == 200
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    after = scrape_with_sources(push_stack.decode_url)
    transferred = by_source(after, "external_kv_transfer") - by_source(before, "external_kv_transfer")
    computed = by_source(after, "local_compute") - by_source(before, "local_compute")
    assert transferred >= prompt_tokens - 1 and computed <= 1, (prompt_tokens, transferred, computed)
    # The prefill worker wrote the blocks and let them go: nothing left held for a decode.
    assert harness.wait_idle(push_stack.prefill_url) == (0, 0)
    prefill = harness.scrape(push_stack.prefill_url)
    assert prefill.get("vllm:nixl_num_failed_transfers_total", 0) == 0


def test_the_kv_only_drafter_pass_stays_on_with_push(push_stack):
    (state,) = [dict(labels)["state"] for labels in harness.scrape_labeled(push_stack.prefill_url, "pdspec_engine_feature")
                if dict(labels)["feature"] == "kv_only_pass"]  # fmt: skip
    assert state == "on"
