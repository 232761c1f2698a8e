"""Worker-side figures over a measured window, from two scrapes of a vLLM worker's /metrics.

The prefill worker's prompt tokens/s and its proposals (all and K=0: pdspec's engine
plugin counters); the decode worker's mean acceptance length, 1 + accepted / drafts,
as vLLM defines it; a pool's prefix-cache hit rate, hit tokens over queried tokens.
"""

from __future__ import annotations

import time
from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

PROMPT_TOKENS = "vllm:prompt_tokens_total"
PROPOSALS = "pdspec_proposals_total"
K0_PROPOSALS = "pdspec_k0_proposals_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
NIXL_BYTES = "vllm:nixl_bytes_transferred_sum"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
# Counters reported per phase for each worker, as deltas.
COUNTERS = (
    PROMPT_TOKENS,
    PROPOSALS,
    K0_PROPOSALS,
    DRAFTS,
    DRAFT_TOKENS,
    ACCEPTED,
    NIXL_BYTES,
    PREFIX_HITS,
    PREFIX_QUERIES,
)


def parse(text: str) -> dict[str, float]:
    """Prometheus text as {sample name: value}, summed over label sets (engines, DP ranks)."""
    values: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket")):
                continue
            values[sample.name] += sample.value
    return dict(values)


def scrape(client: httpx.Client, url: str) -> dict[str, float]:
    response = client.get(url + "/metrics", timeout=10)
    response.raise_for_status()
    return parse(response.text)


def busy(values: dict[str, float]) -> float:
    return values.get("vllm:num_requests_running", 0.0) + values.get("vllm:num_requests_waiting", 0.0)


def scrape_when_idle(client: httpx.Client, url: str, timeout_s: float = 60.0) -> dict[str, float]:
    """Scrape once the worker runs and queues nothing: vLLM records a step's counters with
    the same scheduler stats that carry these gauges, so an idle reading has them all."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = scrape(client, url)
        if busy(values) == 0 or time.monotonic() > deadline:
            return values
        time.sleep(0.1)  # poll interval


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in COUNTERS}


def acceptance_length(delta: dict[str, float]) -> float | None:
    drafts = delta.get(DRAFTS, 0.0)
    return 1.0 + delta.get(ACCEPTED, 0.0) / drafts if drafts > 0 else None


def sum_deltas(per_worker: list[dict[str, float]]) -> dict[str, float]:
    """A pool's deltas: each counter summed over its workers."""
    return {name: sum(delta.get(name, 0.0) for delta in per_worker) for name in COUNTERS}


def prefix_cache_hit_rate(delta: dict[str, float]) -> float | None:
    """Prompt tokens found in the prefix cache over those looked up (vLLM's
    prefix_cache_hits / prefix_cache_queries); None when nothing was looked up."""
    queries = delta.get(PREFIX_QUERIES, 0.0)
    return delta.get(PREFIX_HITS, 0.0) / queries if queries > 0 else None


def worker_figures(prefill: dict[str, float] | None, decode: dict[str, float] | None, duration_s: float) -> dict:
    """The phase fields the issue names, from the two workers' deltas (None: not scraped)."""
    figures: dict = {
        "prefill_tokens_per_s": None,
        "prefill_proposals": None,
        "prefill_k0_proposals": None,
        "decode_acceptance_length": None,
    }
    if prefill is not None:
        figures["prefill_tokens_per_s"] = prefill[PROMPT_TOKENS] / duration_s if duration_s > 0 else 0.0
        figures["prefill_proposals"] = int(prefill[PROPOSALS])
        figures["prefill_k0_proposals"] = int(prefill[K0_PROPOSALS])
    if decode is not None:
        figures["decode_acceptance_length"] = acceptance_length(decode)
    figures["workers"] = {"prefill": prefill, "decode": decode}
    return figures
