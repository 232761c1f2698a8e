"""The proxy's own Prometheus metrics (prefix `pdspec_proxy_`, never `vllm:`).

Every gauge names how its value combines over the proxy's processes (`multiprocess_mode`:
`livesum` for what each process holds, such as requests in flight; `livemin` / `livemax`
for each process's view of a worker, such as healthy workers or the KV index's blocks).
It matters only with `proxy.workers` > 1, where a scrape of any process reads them all
(proxy/shared_metrics.py); one process ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy.shared_metrics import REMOVED

PREFILL_OUTCOMES = ("ok", "retried_ok", "fallback", "error")
# Why a request was served decode-only (proxy/apis/legs.py, decode_only_reason).
DECODE_ONLY_REASONS = ("beam_search", "structured_output")
# Why a client connection was refused (proxy/edge/connections.py).
REFUSAL_REASONS = ("header_too_large", "head_timeout", "body_timeout", "too_many_connections")
# Why the worker that decodes prefilled a prompt itself (conditional disaggregation, proxy/routing/kv_router.py):
# the decode worker, or a prefill worker serving the request whole (decode_full).
LOCAL_PREFILL_REASONS = ("cached_on_decode", "short_prompt", "prefill_queue", "decode_full")
# Where cache-aware routing got a prompt's token ids (proxy/routing/kv_router.py, token_ids).
PROMPT_ID_SOURCES = ("given", "proxy", "worker", "none")
# What the cache index did with the workers' KV events (proxy/routing/kv_index.py, kv_subscriber.py).
KV_EVENT_KINDS = (
    "stored",
    "removed",
    "cleared",
    "orphans",
    "skipped",
    "evicted",
    "malformed_events",
    "bad_messages",
    "lost_batches",
    "replays",
    "restarts",
)


@dataclass
class ProxyMetrics:
    registry: CollectorRegistry
    requests: Counter
    leg_seconds: Histogram
    leg_failures: Counter
    stream_errors: Counter
    prefill_outcomes: Counter
    healthy_workers: Gauge
    worker_inflight: Gauge
    kv_releases: Counter
    kv_reprefills: Counter
    early_decodes: Counter
    kv_room_waits: Counter
    prefill_rate: Gauge
    prefill_queued_seconds: Gauge
    prefill_kv_free_tokens: Gauge
    inflight: Gauge
    pairing_refusals: Counter
    refused_workers: Gauge
    queued: Gauge
    client_refusals: Counter
    decode_only: Counter
    loop_lag: Histogram
    health_checks_discarded: Counter
    local_prefills: Counter
    routing_decisions: Counter
    prompt_token_ids: Counter
    tokenizer_agrees: Gauge
    predicted_hit_tokens: Counter
    kv_events: Counter
    kv_index_blocks: Gauge
    kv_event_lag: Gauge
    decode_pending_tokens: Gauge
    plan_replicas: Gauge
    # One of several processes, its values in prometheus_client's multiprocess files
    # (proxy/shared_metrics.py): a gauge's series cannot be deleted there, only marked removed.
    shared: bool = False

    @classmethod
    def create(cls, shared: bool = False) -> ProxyMetrics:
        # One registry per app, so tests can build many apps in one process.
        registry = CollectorRegistry()
        metrics = cls(
            shared=shared,
            registry=registry,
            requests=Counter(
                "pdspec_proxy_requests",
                "Client requests by endpoint and status.",
                ["endpoint", "status"],
                registry=registry,
            ),
            leg_seconds=Histogram(
                "pdspec_proxy_leg_seconds",
                "Duration of each leg (prefill: to response; decode: to last byte; handoff: prefill reply to the "
                "decode worker's first byte).",
                ["leg"],
                registry=registry,
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            ),
            leg_failures=Counter(
                "pdspec_proxy_leg_failures",
                "Legs that failed, by leg and reason.",
                ["leg", "reason"],
                registry=registry,
            ),
            stream_errors=Counter(
                "pdspec_proxy_stream_errors",
                "Streams ended with an SSE error event after they began.",
                registry=registry,
            ),
            prefill_outcomes=Counter(
                "pdspec_proxy_prefill_outcomes",
                "Prefill legs by outcome: ok, retried_ok, fallback (decode-only), error.",
                ["outcome"],
                registry=registry,
            ),
            healthy_workers=Gauge(
                "pdspec_proxy_healthy_workers",
                "Healthy workers per pool.",
                ["pool"],
                registry=registry,
                multiprocess_mode="livemin",
            ),
            worker_inflight=Gauge(
                "pdspec_proxy_worker_inflight",
                "Legs the proxy has open on each worker (what least_outstanding routing reads).",
                ["pool", "worker"],
                registry=registry,
                multiprocess_mode="livesum",
            ),
            kv_releases=Counter(
                "pdspec_proxy_kv_releases",
                "One-token decodes sent to free a prefill's KV whose decode will not come, by why "
                "(client_gone: the request was given up, by its client or because another choice of its n failed; "
                "http_4xx, http_5xx, connect_error, timeout, connection_reset, no_healthy_worker, ...: how the decode "
                "leg failed) and how the release went (ok, http_4xx, ..., no_decode_worker).",
                ["reason", "outcome"],
                registry=registry,
            ),
            kv_reprefills=Counter(
                "pdspec_proxy_kv_reprefills",
                "Prefills run again for a decode retry, by how the previous decode attempt failed: that attempt "
                "was handed the first prefill's KV and may still read it, and a prefill's KV goes to one decode "
                "request only.",
                ["reason"],
                registry=registry,
            ),
            early_decodes=Counter(
                "pdspec_proxy_early_decodes",
                "Decode legs sent together with their prefill leg (proxy.kv_transfer.early_decode, "
                "pushed KV), by outcome: used (the leg got its prefill's KV); stale_source (the prefill worker "
                "answered as another engine); prefill_failed and client_gone (the leg was not used); completed or "
                "not_completed (a failed prefill whose leg reached the decode worker, sent again to its worker, "
                "ended or not: ended, it frees the decode worker's registered blocks).",
                ["outcome"],
                registry=registry,
            ),
            kv_room_waits=Counter(
                "pdspec_proxy_kv_room_waits",
                "Prefill legs that waited for room on a prefill worker (admission.prefill_kv: KV room, or queued "
                "prefill time under prefill_queue_budget_s), by how the wait ended: admitted, or timeout (503).",
                ["outcome"],
                registry=registry,
            ),
            prefill_rate=Gauge(
                "pdspec_proxy_prefill_rate_tokens_per_second",
                "Each prefill worker's prefill rate as the proxy measures it: prompt tokens answered per second of "
                "the time it had prefill legs in flight (admission.prefill_kv).",
                ["worker"],
                registry=registry,
                multiprocess_mode="livemax",
            ),
            prefill_queued_seconds=Gauge(
                "pdspec_proxy_prefill_queued_seconds",
                "The prefill time of the prompts the proxy has in flight on each prefill worker, at its measured "
                "rate; admission sends a leg only while it stays within prefill_queue_budget_s, except a prompt "
                "over the budget, which goes alone (admission.prefill_kv).",
                ["worker"],
                registry=registry,
                multiprocess_mode="livemax",
            ),
            prefill_kv_free_tokens=Gauge(
                "pdspec_proxy_prefill_kv_free_tokens",
                "Free KV tokens of each prefill worker at the proxy's last reading, less the prompts sent to it "
                "since (admission.prefill_kv).",
                ["worker"],
                registry=registry,
                multiprocess_mode="livemin",
            ),
            inflight=Gauge(
                "pdspec_proxy_inflight_requests",
                "Client requests in flight.",
                registry=registry,
                multiprocess_mode="livesum",
            ),
            pairing_refusals=Counter(
                "pdspec_proxy_pairing_refusals",
                "Workers refused because their pdspec_worker_info differs from the pairing reference, by pool "
                "and differing field (model, drafter, method, block_size, kv_connector; worker_info: none exported).",
                ["pool", "field"],
                registry=registry,
            ),
            refused_workers=Gauge(
                "pdspec_proxy_refused_workers",
                "Workers that answer health checks but are refused by the pairing check, per pool.",
                ["pool"],
                registry=registry,
                multiprocess_mode="livemax",
            ),
            queued=Gauge(
                "pdspec_proxy_queued_requests",
                "Client requests waiting for an in-flight slot.",
                registry=registry,
                multiprocess_mode="livesum",
            ),
            client_refusals=Counter(
                "pdspec_proxy_client_refusals",
                "Client connections refused by a limit of proxy/edge/connections.py, by "
                "reason (header_too_large, head_timeout, body_timeout, too_many_connections).",
                ["reason"],
                registry=registry,
            ),
            decode_only=Counter(
                "pdspec_proxy_decode_only",
                "Requests sent whole to a decode worker because vLLM cannot serve them "
                "through P/D, by reason (beam_search; structured_output under structured_outputs=decode_only: see proxy/apis/legs.py).",
                ["reason"],
                registry=registry,
            ),
            loop_lag=Histogram(
                "pdspec_proxy_event_loop_lag_seconds",
                "How late the proxy's event loop ran a timer (sampled every 0.1 s): time its loop was blocked.",
                registry=registry,
                buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            ),
            health_checks_discarded=Counter(
                "pdspec_proxy_health_checks_discarded",
                "Failed health checks not counted against a worker because "
                "the proxy's own event loop was blocked while they ran.",
                registry=registry,
            ),
            local_prefills=Counter(
                "pdspec_proxy_local_prefills",
                "Requests served without a prefill leg under conditional disaggregation, the worker "
                "that decodes prefilling the prompt itself, by reason (the decode worker: cached_on_decode: it held "
                "all but a short part of the prompt; short_prompt: the prompt is short and nothing of it was cached; "
                "prefill_queue: the prefill pool's work ahead exceeded the decode worker's by more than "
                "local_prefill_max_tokens; a prefill worker, serving the request whole: decode_full: no decode "
                "worker had KV room for the prompt).",
                ["reason"],
                registry=registry,
            ),
            routing_decisions=Counter(
                "pdspec_proxy_routing_decisions",
                "Cache-aware routing decisions by pool and reason (cache_hit: the "
                "worker picked holds part of the prompt; no_cache_hit; no_token_ids: the prompt's ids could not be "
                "read, routed by load).",
                ["pool", "reason"],
                registry=registry,
            ),
            prompt_token_ids=Counter(
                "pdspec_proxy_prompt_token_ids",
                "Where cache-aware routing got each prompt's token ids: given (in the request), proxy "
                "(routing.tokenizer, in the proxy), worker (a decode worker's /tokenize or render endpoint), none "
                "(not known: routed by load).",
                ["source"],
                registry=registry,
            ),
            tokenizer_agrees=Gauge(
                "pdspec_proxy_tokenizer_agrees",
                "routing.tokenizer against a decode worker's /tokenize, by kind (text, chat): 1 it "
                "agreed on every probe, the proxy tokenizes that kind itself; 0 it did not, the round trip "
                "(proxy/routing/tokenizer_check.py). Absent until checked.",
                ["kind"],
                registry=registry,
                multiprocess_mode="livemin",  # each process checks for itself: 1 only if every one agreed
            ),
            predicted_hit_tokens=Counter(
                "pdspec_proxy_predicted_hit_tokens",
                "Prompt tokens the proxy's index expected the worker it picked to "
                "hold (compare with vllm:prefix_cache_hits_total).",
                ["pool", "worker"],
                registry=registry,
            ),
            kv_events=Counter(
                "pdspec_proxy_kv_events",
                "The workers' KV events as the proxy's index took them, by kind: stored, "
                "removed (blocks), cleared, orphans (parent never seen), skipped (other block size, LoRA, multimodal), "
                "evicted (index bound), malformed_events, bad_messages, lost_batches, replays, restarts.",
                ["kind"],
                registry=registry,
            ),
            kv_index_blocks=Gauge(
                "pdspec_proxy_kv_index_blocks",
                "KV blocks the proxy's index holds per worker.",
                ["worker"],
                registry=registry,
                multiprocess_mode="livemax",
            ),
            kv_event_lag=Gauge(
                "pdspec_proxy_kv_event_lag_seconds",
                "Age of the last KV event batch from each worker when it arrived (publisher clock to proxy clock).",
                ["worker"],
                registry=registry,
                multiprocess_mode="livemax",
            ),
            decode_pending_tokens=Gauge(
                "pdspec_proxy_decode_pending_tokens",
                "Conditional disaggregation: prompt tokens of the requests planned disaggregated whose decode leg "
                "has not yet leased a decode worker's KV (their prefill legs run), which decode_full weighs with "
                "routing.decode_full_counts_pending.",
                registry=registry,
                multiprocess_mode="livesum",
            ),
            plan_replicas=Gauge(
                "pdspec_plan_replicas",
                "The fleet planner's replicas per role, as the proxy was given them (observability.plan_replicas; "
                "absent when none were): the autoscalers keep the decode workers at least at its ratio of the prefill workers.",
                ["role"],
                registry=registry,
                multiprocess_mode="livemax",
            ),
        )
        # Every outcome exported at 0 from the start: a counter's first scraped sample is
        # where its rate starts, so a series born at 3 (three fallbacks within one scrape
        # interval) would show no rate and the fallback alert would never fire.
        for outcome in PREFILL_OUTCOMES:
            metrics.prefill_outcomes.labels(outcome)
        for reason in REFUSAL_REASONS:
            metrics.client_refusals.labels(reason)
        for reason in DECODE_ONLY_REASONS:
            metrics.decode_only.labels(reason)
        for reason in LOCAL_PREFILL_REASONS:
            metrics.local_prefills.labels(reason)
        for source in PROMPT_ID_SOURCES:
            metrics.prompt_token_ids.labels(source)
        for kind in KV_EVENT_KINDS:
            metrics.kv_events.labels(kind)
        return metrics

    def remove_series(self, gauge: Gauge, *labels: str) -> None:
        """Drops one series of a labelled gauge (none exported: nothing to do); shared, marks
        it removed, which the scrape leaves out."""
        if self.shared:
            gauge.labels(*labels).set(REMOVED)
            return
        try:
            gauge.remove(*labels)
        except KeyError:
            pass

    def set_series(self, gauge: Gauge, values: dict[tuple[str, ...], float]) -> None:
        """Sets a labelled gauge to exactly `values` (label values -> value): the series it
        had besides them are dropped."""
        if not self.shared:
            gauge.clear()
        else:
            for sample in gauge.collect()[0].samples:
                labels = tuple(sample.labels.values())  # in the gauge's label order
                if labels not in values:
                    gauge.labels(*labels).set(REMOVED)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
