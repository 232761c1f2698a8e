"""Pairing safety with real vLLM workers: each worker's `pdspec_worker_info` on its own
/metrics, and a proxy that refuses a decode worker whose KV block size differs from the
prefill worker's (the worker is real, started with `--block-size 64`)."""

import subprocess
import sys

import httpx
import pytest

from tests import harness
from tests.prompts import completion_body, unique_prompt

# Free ports among the e2e ones (the shared stack: 18000-18400; test_bad_input: 18050).
PROXY_PORT, MISMATCHED_PORT, MISMATCHED_SIDE_CHANNEL = 18060, 18260, 18460


def worker_info(url: str) -> dict:
    (series,) = harness.scrape_labeled(url, "pdspec_worker_info").items()  # exactly one series
    labels, value = series
    assert value == 1.0
    return dict(labels)


def vllm_block_size(url: str) -> str:
    """vLLM's own view of its cache config (`vllm:cache_config_info`)."""
    (labels,) = harness.scrape_labeled(url, "vllm:cache_config_info")
    return dict(labels)["block_size"]


def set_policy(run_dir, role: str, policy: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pdspec.cli", "drafts", "--role", role, "--policy", policy, "--run_dir", str(run_dir)],
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_both_workers_export_the_config_they_run(stack):
    import vllm

    models = harness.models_dir()
    # Where each publishes its KV events: the stack's ports (tests/harness.py), replay next.
    kv_ports = {"prefill": harness.STACK_BASE_PORT + 500, "decode": harness.STACK_BASE_PORT + 600}
    for role, url in (("prefill", stack.prefill_url), ("decode", stack.decode_url)):
        info = worker_info(url)
        assert info == {
            "role": role,
            "model": str(models / "target"),
            "drafter": str(models / "eagle3"),
            "method": "eagle3",
            "num_speculative_tokens": "3",
            "block_size": vllm_block_size(url),
            "kv_connector": "pull",
            "vllm_version": vllm.__version__,
            "drafts_policy": "auto",
            "kv_events_endpoint": f"tcp://*:{kv_ports[role]}",
            "kv_events_replay_endpoint": f"tcp://*:{kv_ports[role] + 1}",
            "kv_events_topic": "kv",
        }
    ready = httpx.get(stack.proxy_url + "/ready").json()
    assert ready["pairing"]["refused"] == [] and ready["pairing"]["unverified"] == []
    assert ready["pairing"]["reference"] == {
        k: info[k] for k in ("model", "drafter", "method", "block_size", "kv_connector")
    }


def test_drafts_policy_label_follows_pdspec_drafts(stack):
    try:
        set_policy(stack.run_dir, "prefill", "always")
        assert worker_info(stack.prefill_url)["drafts_policy"] == "always"  # the old series is gone
    finally:
        set_policy(stack.run_dir, "prefill", "auto")
    assert worker_info(stack.prefill_url)["drafts_policy"] == "auto"


@pytest.fixture
def mismatched_decode(stack, tmp_path):
    """A real decode worker beside the stack, with another KV block size."""
    server = harness.start_worker(
        "decode",
        tmp_path,
        MISMATCHED_PORT,
        MISMATCHED_SIDE_CHANNEL,
        cpu_omp_threads_bind="1",
        extra_vllm_args=["--block-size", "64"],
    )
    try:
        harness.wait_healthy(server.url, server.process, tmp_path / f"decode-{MISMATCHED_PORT}.log")
        yield server
    finally:
        server.stop()


def test_proxy_refuses_a_decode_worker_with_another_block_size(stack, mismatched_decode, client):
    assert worker_info(mismatched_decode.url)["block_size"] == vllm_block_size(mismatched_decode.url) == "64"
    good_block_size = worker_info(stack.prefill_url)["block_size"]
    proxy = harness.start_proxy(
        PROXY_PORT,
        prefill_urls=[stack.prefill_url],
        decode_urls=[mismatched_decode.url, stack.decode_url],
        routing={"decode_policy": "round_robin"},
        health={"interval_s": 0.5},
        # the stack's prefill side channel (tests/harness.py)
        kv_transfer={"source_ports": [str(harness.STACK_BASE_PORT + 300)]},
    )
    try:
        harness.wait_healthy(proxy.url, proxy.process, path="/ready")  # the stack's own pair serves
        ready = client.get(proxy.url + "/ready").json()
        before = harness.scrape(mismatched_decode.url)
        for _ in range(4):  # round robin over two decode workers, if both were taken
            response = client.post(proxy.url + "/v1/completions", json=completion_body(unique_prompt(40)))
            assert response.status_code == 200
        after = harness.scrape(mismatched_decode.url)
        metrics = harness.scrape_labeled(proxy.url, "pdspec_proxy_pairing_refusals_total")
        refused_gauge = harness.scrape_labeled(proxy.url, "pdspec_proxy_refused_workers")
    finally:
        proxy.stop()
    assert ready["healthy_workers"] == {"prefill": 1, "decode": 1}
    assert ready["pairing"]["refused"] == [
        {
            "pool": "decode",
            "worker": mismatched_decode.url,
            "against": f"prefill worker {stack.prefill_url}",
            "fields": {"block_size": {"worker": "64", "reference": good_block_size}},
        }
    ]
    # Counted once per refusal (more only if a failed health check made it re-join).
    assert list(metrics) == [(("field", "block_size"), ("pool", "decode"))]
    assert metrics[(("field", "block_size"), ("pool", "decode"))] >= 1.0
    assert refused_gauge[(("pool", "decode"),)] == 1.0
    # Not one request reached it: vLLM counts every request it finishes.
    assert after.get("vllm:request_success_total", 0) == before.get("vllm:request_success_total", 0) == 0
