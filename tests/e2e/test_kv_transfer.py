"""Proof that the prompt's KV crossed over NIXL (target and drafter layers) and was not
recomputed on the decode worker."""

import json
import math

import pytest

from tests import harness
from tests.prompts import completion_body, unique_prompt


def kv_bytes_per_block(block_size: int) -> int:
    """K and V of every attention layer that is transferred: the target's and the drafter's."""
    models = harness.models_dir()
    target = json.loads((models / "target" / "config.json").read_text())
    drafter = json.loads((models / "eagle3" / "config.json").read_text())
    layers = target["num_hidden_layers"] + drafter["num_hidden_layers"]
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[target["torch_dtype"]]
    per_layer = 2 * block_size * target["num_key_value_heads"] * target["head_dim"] * dtype_bytes  # K and V
    return layers * per_layer


def block_size(url: str) -> int:
    info = harness.scrape_labeled(url, "vllm:cache_config_info")
    (labels,) = info.keys()
    return int(dict(labels)["block_size"])


@pytest.mark.parametrize("words", [20, 150, 400])
def test_decode_worker_pulls_exactly_the_prompt_kv(stack, client, words):
    before = scrape_with_sources(stack.decode_url)
    response = client.post(stack.proxy_url + "/v1/completions", json=completion_body(unique_prompt(words)))
    assert response.status_code == 200
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    after = scrape_with_sources(stack.decode_url)

    size = block_size(stack.decode_url)
    expected = math.ceil(prompt_tokens / size) * kv_bytes_per_block(size)
    moved = after["vllm:nixl_bytes_transferred_sum"] - before.get("vllm:nixl_bytes_transferred_sum", 0)
    assert moved == expected, f"{prompt_tokens} prompt tokens: moved {moved} bytes, expected {expected}"
    assert after["vllm:nixl_num_failed_transfers_total"] == 0
    # The decode worker did not recompute the prompt: vLLM counts prompt tokens by source.
    computed = by_source(after, "local_compute") - by_source(before, "local_compute")
    transferred = by_source(after, "external_kv_transfer") - by_source(before, "external_kv_transfer")
    assert transferred >= prompt_tokens - 1
    assert computed <= 1


def by_source(scraped: dict, source: str) -> float:
    return scraped.get(f"prompt_tokens_by_source_total/{source}", 0.0)


def scrape_with_sources(url: str) -> dict:
    values = harness.scrape(url)
    for labels, value in harness.scrape_labeled(url, "vllm:prompt_tokens_by_source_total").items():
        values[f"prompt_tokens_by_source_total/{dict(labels)['source']}"] = value
    return values
