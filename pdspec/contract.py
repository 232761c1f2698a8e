"""The contract between pdspec's pieces, typed once: what the proxy, the workers, the CLI
and the benchmarks must agree on. No vLLM and no metrics objects here, so the proxy can
import it and stay light.

- drafts policy: `auto` proposes with K=0 when no scheduled request can use the drafts;
  `always` drafts every step (for A/B runs);
- routing policies of the proxy's pools (proxy/fleet/pool.py);
- the Prometheus series a worker exports for the proxy to read: `pdspec_worker_info` (its
  config, for the pairing check) and `pdspec_engine_feature` (each engine feature's state).
"""

from __future__ import annotations

import typing
from typing import Literal

DraftsPolicy = Literal["auto", "always"]
DRAFTS_POLICIES: tuple[str, ...] = typing.get_args(DraftsPolicy)

RoutingPolicy = Literal["round_robin", "least_outstanding", "prefix_affinity", "kv_aware"]
DecodeRoutingPolicy = Literal["round_robin", "least_outstanding", "kv_aware"]
# Whether every request is disaggregated, or only those whose uncached part is long.
Disaggregation = Literal["always", "conditional"]

WORKER_INFO_METRIC = "pdspec_worker_info"
# Its labels that tell the proxy where the worker publishes its KV-cache events (empty: it
# does not), and the topic pdspec's workers publish them under.
KV_EVENTS_LABELS = ("kv_events_endpoint", "kv_events_replay_endpoint", "kv_events_topic")
KV_EVENTS_TOPIC = "kv"
ENGINE_FEATURE_METRIC = "pdspec_engine_feature"
