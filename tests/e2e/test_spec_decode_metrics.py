"""Speculative decoding runs on the decode worker; the prefill worker's drafts are never
verified, so none of them is accepted."""

from tests import harness
from tests.prompts import completion_body, unique_prompt


def test_decode_drafts_and_prefill_accepts_nothing(stack, client):
    d_before = harness.scrape(stack.decode_url)
    for _ in range(3):
        assert (
            client.post(stack.proxy_url + "/v1/completions", json=completion_body(unique_prompt())).status_code == 200
        )
    d_after = harness.scrape(stack.decode_url)
    p_after = harness.scrape(stack.prefill_url)

    drafts = d_after["vllm:spec_decode_num_drafts_total"] - d_before.get("vllm:spec_decode_num_drafts_total", 0)
    draft_tokens = d_after["vllm:spec_decode_num_draft_tokens_total"] - d_before.get(
        "vllm:spec_decode_num_draft_tokens_total", 0
    )
    assert drafts > 0
    assert draft_tokens == 3 * drafts  # K=3 on the decode worker
    assert p_after.get("vllm:spec_decode_num_accepted_tokens_total", 0) == 0
    assert p_after.get("vllm:spec_decode_num_drafts_total", 0) == 0
