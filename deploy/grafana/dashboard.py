"""Builds deploy/grafana/pdspec-dashboard.json: `python deploy/grafana/dashboard.py`.

The dashboard is written as code so every PromQL expression is in one readable place;
the JSON beside it is what Grafana loads (a unit test keeps the two equal). Per-worker
series get their `role` by a join with each worker's `pdspec_worker_info` gauge, so no
relabelling is needed in Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("pdspec-dashboard.json")
SCHEMA_VERSION = 41  # Grafana 12's classic dashboard schema; Grafana 11 and 13 load it as well
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"

# Role and instance of each worker, filtered by the dashboard's variables. One series
# per worker (max by), so a join never meets two info series of one instance.
WORKER = 'max by (instance, role) (pdspec_worker_info{role=~"$role", instance=~"$instance"})'


def by_role(expr: str, extra: str = "") -> str:
    """`expr` (one series per instance, or per instance and `extra` labels) with `role` added."""
    return f"({expr}) * on (instance) group_left (role) {WORKER}"


def per_worker_rate(metric: str) -> str:
    return by_role(f"sum by (instance) (rate({metric}[{RATE}]))")


def quantile(q: float, bucket: str, by: str = "instance") -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({bucket}[{RATE}])))"


class Panels:
    """Lays panels out on Grafana's 24-column grid, row by row."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self.y = 0
        self.x = 0
        self.row_height = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self._id(),
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_height
            self.x = 0
            self.row_height = 0

    def add(
        self,
        kind: str,
        title: str,
        description: str,
        targets: list[tuple[str, str]],
        *,
        w: int = 8,
        h: int = 8,
        unit: str = "short",
        instant: bool = False,
        options: dict | None = None,
        max_value: float | None = None,
    ) -> None:
        if self.x + w > 24:
            self._newline()
        defaults: dict = {"unit": unit}
        if max_value is not None:
            defaults["max"] = max_value
            defaults["min"] = 0
        panel = {
            "type": kind,
            "title": title,
            "description": description,
            "id": self._id(),
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options or {},
            "targets": [
                {
                    "datasource": DS,
                    "refId": chr(ord("A") + i),
                    "expr": expr,
                    "legendFormat": legend,
                    "range": not instant,
                    "instant": instant,
                    **({"format": "table"} if kind == "table" else {}),
                }
                for i, (expr, legend) in enumerate(targets)
            ],
        }
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)


def build() -> dict:
    p = Panels()
    stat = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "textMode": "value_and_name"}

    p.row("K=0 proposals: prefill workers must not draft")
    p.add(
        "stat",
        "K=0 share of drafter steps (time range)",
        "K=0 proposals / all proposals per worker over the dashboard's time range. Prefill workers in "
        "policy `auto` read 100%: their drafts would never be verified. Decode workers read low (only "
        "steps where no request can use a draft).",
        [
            (
                by_role(
                    "sum by (instance) (increase(pdspec_k0_proposals_total[$__range])) / "
                    "(sum by (instance) (increase(pdspec_proposals_total[$__range])) > 0)"
                ),
                "{{role}} {{instance}}",
            )
        ],
        unit="percentunit",
        options=stat,
        w=8,
        h=6,
    )
    p.add(
        "stat",
        "K=0 proposals / proposals (since start)",
        "The raw counters of each worker, as `pdspec_k0_proposals_total` and `pdspec_proposals_total`: equal "
        "on a prefill worker in `auto`.",
        [
            (by_role("sum by (instance) (pdspec_k0_proposals_total)"), "{{role}} K=0"),
            (by_role("sum by (instance) (pdspec_proposals_total)"), "{{role}} all"),
        ],
        options=stat,
        w=8,
        h=6,
        instant=True,
    )
    p.add(
        "timeseries",
        "K=0 share (5m, recorded)",
        "Recording rule instance:pdspec_k0_proposal_ratio:rate5m: the alert on prefill drafting reads it.",
        [(by_role("instance:pdspec_k0_proposal_ratio:rate5m"), "{{role}} {{instance}}")],
        unit="percentunit",
        w=8,
        h=6,
        max_value=1,
    )
    p.add(
        "timeseries",
        "Drafter steps per second: all and K=0",
        "Engine steps in which the drafter ran, and those that proposed with K=0.",
        [
            (per_worker_rate("pdspec_proposals_total"), "{{role}} {{instance}} all"),
            (per_worker_rate("pdspec_k0_proposals_total"), "{{role}} {{instance}} K=0"),
        ],
        unit="ops",
        w=12,
    )
    p.add(
        "timeseries",
        "Draft tokens skipped per second",
        "Draft tokens not proposed because no scheduled request could use them (K times each K=0 step).",
        [(per_worker_rate("pdspec_draft_tokens_skipped_total"), "{{role}} {{instance}}")],
        unit="ops",
        w=12,
    )

    p.add(
        "table",
        "Engine features off",
        "pdspec's engine features that are off on a worker, with the reason (pdspec_engine_feature). On a "
        "prefill worker the KV-only drafter pass should be on; an off row explains a slower prefill.",
        [
            (
                by_role('max by (instance, feature, reason) (pdspec_engine_feature{state="off"}) == 1'),
                "{{role}} {{instance}} {{feature}}",
            )
        ],
        w=24,
        h=6,
        instant=True,
    )
    p.add(
        "timeseries",
        "K=0 steps on the KV-only pass",
        "K=0 steps per second, and those whose drafter KV the KV-only pass wrote (equal on a prefill worker "
        "with the pass on).",
        [
            (per_worker_rate("pdspec_k0_proposals_total"), "{{role}} {{instance}} K=0"),
            (per_worker_rate("pdspec_kv_only_passes_total"), "{{role}} {{instance}} KV-only"),
            (per_worker_rate("pdspec_kv_only_graph_replays_total"), "{{role}} {{instance}} as a CUDA graph"),
        ],
        unit="ops",
        w=12,
    )
    p.add(
        "timeseries",
        "Engine GC pauses",
        "Share of time each worker's vLLM processes spent in Python's garbage collector "
        "(pdspec_engine_gc_pause_seconds_total). A share that climbs with uptime, traffic unchanged, is objects "
        "piling up in the engine.",
        [(per_worker_rate("pdspec_engine_gc_pause_seconds_total"), "{{role}} {{instance}}")],
        unit="percentunit",
        w=12,
    )

    p.row("Speculative decoding on decode workers")
    accepted = f"sum by (instance) (rate(vllm:spec_decode_num_accepted_tokens_total[{RATE}]))"
    p.add(
        "timeseries",
        "Acceptance rate",
        "Accepted draft tokens / proposed draft tokens.",
        [
            (
                by_role(
                    f"{accepted} / (sum by (instance) (rate(vllm:spec_decode_num_draft_tokens_total[{RATE}])) > 0)"
                ),
                "{{role}} {{instance}}",
            )
        ],
        unit="percentunit",
        max_value=1,
    )
    p.add(
        "timeseries",
        "Mean acceptance length",
        "Tokens per verification step, 1 + accepted / drafts (1 to K+1). A fall against its own past, "
        "with traffic unchanged, usually means the drafter's KV no longer arrives from the prefill worker.",
        [
            (
                by_role(f"1 + {accepted} / (sum by (instance) (rate(vllm:spec_decode_num_drafts_total[{RATE}])) > 0)"),
                "{{role}} {{instance}}",
            )
        ],
    )
    p.add(
        "timeseries",
        "Acceptance by draft position",
        "Share of verification steps whose draft token at this position was accepted.",
        [
            (
                by_role(
                    f"sum by (instance, position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[{RATE}]))"
                    f" / on (instance) group_left () "
                    f"(sum by (instance) (rate(vllm:spec_decode_num_drafts_total[{RATE}])) > 0)"
                ),
                "{{role}} {{instance}} pos {{position}}",
            )
        ],
        unit="percentunit",
        max_value=1,
    )
    p.add(
        "timeseries",
        "Drafts and draft tokens per second",
        "Verification steps with drafts, and the draft tokens in them (K per step).",
        [
            (per_worker_rate("vllm:spec_decode_num_drafts_total"), "{{role}} {{instance}} drafts"),
            (per_worker_rate("vllm:spec_decode_num_draft_tokens_total"), "{{role}} {{instance}} draft tokens"),
        ],
        unit="ops",
        w=24,
        h=6,
    )

    p.row("P/D hand-off")
    p.add(
        "timeseries",
        "NIXL bytes pulled per second",
        "KV (target and drafter layers) read by decode workers from prefill workers.",
        [(per_worker_rate("vllm:nixl_bytes_transferred_sum"), "{{role}} {{instance}}")],
        unit="Bps",
    )
    p.add(
        "timeseries",
        "NIXL transfer time p50 / p99",
        "Per transfer, as the decode worker measures it.",
        [
            (by_role(quantile(0.5, "vllm:nixl_xfer_time_seconds_bucket")), "{{role}} {{instance}} p50"),
            (by_role(quantile(0.99, "vllm:nixl_xfer_time_seconds_bucket")), "{{role}} {{instance}} p99"),
        ],
        unit="s",
    )
    p.add(
        "timeseries",
        "Proxy hand-off time p50 / p99",
        "From the prefill leg's reply to the decode worker's first byte: the NIXL pull plus the first "
        "decode step, as clients feel it.",
        [
            (quantile(0.5, 'pdspec_proxy_leg_seconds_bucket{leg="handoff"}', by="instance"), "{{instance}} p50"),
            (quantile(0.99, 'pdspec_proxy_leg_seconds_bucket{leg="handoff"}', by="instance"), "{{instance}} p99"),
        ],
        unit="s",
    )
    p.add(
        "timeseries",
        "NIXL failed transfers and notifications",
        "Any non-zero value: the decode worker recomputed prompts (failed reads) or a prefill worker "
        "was not told its KV was read.",
        [
            (
                by_role(f"sum by (instance) (increase(vllm:nixl_num_failed_transfers_total[{RATE}]))"),
                "{{role}} {{instance}} failed transfers",
            ),
            (
                by_role(f"sum by (instance) (increase(vllm:nixl_num_failed_notifications_total[{RATE}]))"),
                "{{role}} {{instance}} failed notifications",
            ),
        ],
    )
    p.add(
        "timeseries",
        "KV expired unread on prefill workers",
        "Requests whose KV the prefill worker held until its lease ended, with no decode reading it; "
        "and notifications that came after that.",
        [
            (
                by_role(f"sum by (instance) (increase(vllm:nixl_num_kv_expired_reqs_total[{RATE}]))"),
                "{{role}} {{instance}} expired",
            ),
            (
                by_role(f"sum by (instance) (increase(vllm:nixl_num_notifications_after_expiry_total[{RATE}]))"),
                "{{role}} {{instance}} notified after expiry",
            ),
        ],
    )
    p.add(
        "timeseries",
        "Prefill outcomes per second",
        "ok, retried_ok (another prefill worker), fallback (decode-only: the decode worker prefilled), "
        "error (client got a 5xx).",
        [(f"sum by (outcome) (rate(pdspec_proxy_prefill_outcomes_total[{RATE}]))", "{{outcome}}")],
        unit="reqps",
    )
    p.add(
        "timeseries",
        "Decode-only fallback share (5m, recorded)",
        "Recording rule instance:pdspec_proxy_prefill_fallback_ratio:rate5m; the fallback alert reads it.",
        [("instance:pdspec_proxy_prefill_fallback_ratio:rate5m", "{{instance}}")],
        unit="percentunit",
    )
    p.add(
        "timeseries",
        "Proxy leg failures per second",
        "Failed prefill and decode legs by reason (connection errors, timeouts, worker HTTP status).",
        [(f"sum by (leg, reason) (rate(pdspec_proxy_leg_failures_total[{RATE}]))", "{{leg}} {{reason}}")],
        unit="ops",
    )
    p.add(
        "timeseries",
        "KV releases (client gone between the legs)",
        "One-token decodes the proxy sent so a prefill worker frees KV nobody will read.",
        [(f"sum by (outcome) (increase(pdspec_proxy_kv_releases_total[{RATE}]))", "{{outcome}}")],
    )
    p.add(
        "timeseries",
        "KV read once: re-prefills and stale KV recomputed",
        "A: decode retries that prefilled again, by how the attempt before failed (a prefill's KV goes to one "
        "decode request only). B: decode requests prefilled on their decode worker because their prefill "
        "worker's KV lease may have run out before its scheduler got them (a stalled decode engine).",
        [
            (f"sum by (reason) (increase(pdspec_proxy_kv_reprefills_total[{RATE}]))", "re-prefill {{reason}}"),
            (f"sum by (instance) (increase(pdspec_stale_kv_recomputed_total[{RATE}]))", "stale {{instance}}"),
        ],
    )
    p.add(
        "timeseries",
        "Prefill KV room (admission)",
        "With proxy.admission.prefill_kv: A, each prefill worker's free KV tokens at the proxy's last reading, "
        "less the prompts sent since; B, prefill legs that waited for room, by how the wait ended.",
        [
            ("pdspec_proxy_prefill_kv_free_tokens", "{{worker}}"),
            (f"sum by (outcome) (increase(pdspec_proxy_kv_room_waits_total[{RATE}]))", "waited: {{outcome}}"),
        ],
    )
    p.add(
        "timeseries",
        "Prefill queue (admission)",
        "With proxy.admission.prefill_kv: the prefill time of the prompts the proxy has in flight on each "
        "prefill worker, at the rate it measures from the worker's replies; admission holds it under "
        "proxy.admission.prefill_queue_budget_s (half the prefill timeout by default), so legs wait in the proxy rather "
        "than time out in vLLM's queue.",
        [("pdspec_proxy_prefill_queued_seconds", "{{worker}}")],
        unit="s",
    )

    p.row("Latency and load")
    p.add(
        "timeseries",
        "Time to first token p50 / p99 (workers)",
        "vLLM's TTFT on each worker: on a decode worker it includes the KV pull.",
        [
            (by_role(quantile(0.5, "vllm:time_to_first_token_seconds_bucket")), "{{role}} {{instance}} p50"),
            (by_role(quantile(0.99, "vllm:time_to_first_token_seconds_bucket")), "{{role}} {{instance}} p99"),
        ],
        unit="s",
    )
    p.add(
        "timeseries",
        "Inter-token latency p50 / p99",
        "Time between output tokens on each worker (decode workers carry the stream).",
        [
            (by_role(quantile(0.5, "vllm:inter_token_latency_seconds_bucket")), "{{role}} {{instance}} p50"),
            (by_role(quantile(0.99, "vllm:inter_token_latency_seconds_bucket")), "{{role}} {{instance}} p99"),
        ],
        unit="s",
    )
    p.add(
        "timeseries",
        "Proxy leg time p99",
        "Prefill leg (to its reply) and decode leg (to its last byte), per proxy.",
        [(quantile(0.99, "pdspec_proxy_leg_seconds_bucket", by="instance, leg"), "{{instance}} {{leg}}")],
        unit="s",
    )
    p.add(
        "timeseries",
        "Client requests by status",
        "Requests the proxy answered, by endpoint and HTTP status (499: client left).",
        [(f"sum by (endpoint, status) (rate(pdspec_proxy_requests_total[{RATE}]))", "{{endpoint}} {{status}}")],
        unit="reqps",
    )
    p.add(
        "timeseries",
        "Proxy requests in flight and queued",
        "In flight: admitted (max_inflight); queued: waiting for a slot (max_queue, then 429).",
        [
            ("sum by (instance) (pdspec_proxy_inflight_requests)", "{{instance}} in flight"),
            ("sum by (instance) (pdspec_proxy_queued_requests)", "{{instance}} queued"),
        ],
    )
    p.add(
        "timeseries",
        "Worker queues: running and waiting",
        "Requests each vLLM engine runs, and those waiting for a slot or for KV.",
        [
            (by_role("sum by (instance) (vllm:num_requests_running)"), "{{role}} {{instance}} running"),
            (by_role("sum by (instance) (vllm:num_requests_waiting)"), "{{role}} {{instance}} waiting"),
        ],
    )
    p.add(
        "timeseries",
        "KV cache usage",
        "Share of each worker's KV blocks in use. A prefill worker that stays high while idle holds KV "
        "that no decode read (see the expiry panel).",
        [(by_role("max by (instance) (vllm:kv_cache_usage_perc)"), "{{role}} {{instance}}")],
        unit="percentunit",
        max_value=1,
    )
    p.add(
        "timeseries",
        "Pool health",
        "Healthy workers per pool as each proxy sees them (0: its /ready fails), and whether Prometheus "
        "reaches each target.",
        [
            ("sum by (instance, pool) (pdspec_proxy_healthy_workers)", "{{instance}} healthy {{pool}}"),
            ('up{job=~"pdspec-.*"}', "up {{job}} {{instance}}"),
        ],
    )
    p.row("Cache-aware routing")
    p.add(
        "timeseries",
        "Predicted against real prefix-cache hits",
        "Prompt tokens the proxy's index expected the worker it picked to hold, against the tokens vLLM's "
        "prefix cache really hit on that worker. A wide gap: a stale index (lost events) or another block size.",
        [
            (f"sum by (worker) (rate(pdspec_proxy_predicted_hit_tokens_total[{RATE}]))", "predicted {{worker}}"),
            (by_role(f"sum by (instance) (rate(vllm:prefix_cache_hits_total[{RATE}]))"), "vLLM {{role}} {{instance}}"),
        ],
        unit="short",
    )
    p.add(
        "timeseries",
        "Routing decisions and local prefills",
        "kv_aware picks that found part of the prompt cached (cache_hit) or not, prompts routed without token "
        "ids, and requests the decode worker prefilled itself (conditional disaggregation).",
        [
            (f"sum by (pool, reason) (rate(pdspec_proxy_routing_decisions_total[{RATE}]))", "{{pool}} {{reason}}"),
            (f"sum by (reason) (rate(pdspec_proxy_local_prefills_total[{RATE}]))", "local prefill {{reason}}"),
        ],
        unit="reqps",
    )
    p.add(
        "timeseries",
        "KV index: blocks, event lag, event problems",
        "Blocks the proxy's index holds per worker; how old each worker's last event batch was on arrival; "
        "events the index could not use (orphans, malformed, lost batches, restarts).",
        [
            ("sum by (worker) (pdspec_proxy_kv_index_blocks)", "blocks {{worker}}"),
            ("max by (worker) (pdspec_proxy_kv_event_lag_seconds)", "lag s {{worker}}"),
            (
                f'sum by (kind) (increase(pdspec_proxy_kv_events_total{{kind=~"orphans|malformed_events|bad_messages|'
                f'lost_batches|restarts"}}[{RATE}]))',
                "{{kind}}",
            ),
        ],
    )

    p.add(
        "table",
        "Workers",
        "pdspec_worker_info of each worker: role, model, drafter, method, K, block size, KV connector (pull or "
        "push), vLLM version, "
        "drafts policy. Prefill and decode of one model must agree on all but K.",
        [('pdspec_worker_info{role=~"$role", instance=~"$instance"}', "")],
        w=24,
        h=6,
        instant=True,
        options={"showHeader": True},
    )

    return {
        "uid": "pdspec-pd-spec",
        "title": "pdspec: P/D with speculative decoding",
        "description": "Prefill/decode serving with speculative decoding: K=0 proposals, acceptance, NIXL "
        "hand-off, latency and load. Alerts: deploy/prometheus/rules/alerts.yml.",
        "tags": ["pdspec", "vllm", "speculative-decoding"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                },
                {
                    "name": "role",
                    "label": "Role",
                    "type": "query",
                    "datasource": DS,
                    "query": {"query": "label_values(pdspec_worker_info, role)", "refId": "role"},
                    "definition": "label_values(pdspec_worker_info, role)",
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {},
                    "refresh": 2,
                    "sort": 1,
                },
                {
                    "name": "instance",
                    "label": "Worker",
                    "type": "query",
                    "datasource": DS,
                    "query": {
                        "query": 'label_values(pdspec_worker_info{role=~"$role"}, instance)',
                        "refId": "instance",
                    },
                    "definition": 'label_values(pdspec_worker_info{role=~"$role"}, instance)',
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {},
                    "refresh": 2,
                    "sort": 1,
                },
            ]
        },
        "panels": p.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
