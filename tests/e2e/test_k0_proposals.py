"""K=0 proposals through the real 1P1D stack, read from each worker's own /metrics
(the counters are incremented in vLLM's engine-core process and reach the API server's
/metrics through prometheus-client's multiprocess mode)."""

import subprocess
import sys

from tests import harness
from tests.prompts import completion_body, unique_prompt

SPEC = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def counters(url: str) -> dict:
    values = harness.scrape(url)
    names = ("pdspec_proposals_total", "pdspec_k0_proposals_total", "pdspec_draft_tokens_skipped_total", *SPEC)
    return {name: values.get(name, 0.0) for name in names}


def diff(after: dict, before: dict) -> dict:
    return {name: after[name] - before[name] for name in after}


def test_prefill_worker_proposes_with_k0_in_every_step(stack, client):
    before = counters(stack.prefill_url)
    for words in (30, 150, 400):  # 400 words: several chunks of the prefill budget (512)
        body = completion_body(unique_prompt(words))
        assert client.post(stack.proxy_url + "/v1/completions", json=body).status_code == 200
    step = diff(counters(stack.prefill_url), before)
    assert step["pdspec_proposals_total"] >= 3
    assert step["pdspec_k0_proposals_total"] == step["pdspec_proposals_total"]
    assert step["pdspec_draft_tokens_skipped_total"] == 3 * step["pdspec_k0_proposals_total"]
    assert step["vllm:spec_decode_num_drafts_total"] == 0


def set_policy(stack, role: str, policy: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pdspec.cli",
            "drafts",
            "--role",
            role,
            "--policy",
            policy,
            "--run_dir",
            str(stack.run_dir),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_decode_worker_skips_only_unusable_drafts(stack, client):
    """The same greedy request under `auto` and `always` on the decode worker: equal
    output and equal spec-decode counters, while `auto` proposed K=0 in some step."""
    prompt = unique_prompt(60)
    results = {}
    try:
        for policy in ("auto", "always"):
            set_policy(stack, "decode", policy)
            before = counters(stack.decode_url)
            texts = []
            for max_tokens in (16, 1):  # a max_tokens=1 request is sure to finish in its first step
                response = client.post(
                    stack.proxy_url + "/v1/completions", json=completion_body(prompt, max_tokens=max_tokens)
                )
                assert response.status_code == 200
                texts.append(response.json()["choices"][0]["text"])
            results[policy] = (texts, diff(counters(stack.decode_url), before))
    finally:
        set_policy(stack, "decode", "auto")
    (auto_text, auto), (always_text, always) = results["auto"], results["always"]
    assert auto_text == always_text
    assert {k: auto[k] for k in SPEC} == {k: always[k] for k in SPEC}
    assert auto["pdspec_k0_proposals_total"] >= 1  # at least the max_tokens=1 request's step
    assert auto["pdspec_k0_proposals_total"] < auto["pdspec_proposals_total"]
    assert always["pdspec_k0_proposals_total"] == 0
