"""Read a worker's `pdspec_worker_info` from its /metrics (see pdspec/worker/worker_info.py),
which of its engine features are off (`pdspec_engine_feature`, shown by /ready), and its
KV cache size (vLLM's `vllm:cache_config_info`, also read by admission, proxy/admission/kv_room.py).

Kept cheap, because it runs on the proxy's event loop: the health checker calls it only
when a worker joins, answers again after a failed check, or every
`worker_info_interval_s`; the body is asked for gzipped; and only the info's own lines
go through prometheus-client's text parser, not the whole of vLLM's /metrics.
"""

from __future__ import annotations

import gzip
import typing
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from pdspec.contract import ENGINE_FEATURE_METRIC, WORKER_INFO_METRIC
from pdspec.settings import PairingField
from proxy.upstream.client import UpstreamClient, UpstreamError

METRIC = WORKER_INFO_METRIC
FEATURE_METRIC = ENGINE_FEATURE_METRIC  # pdspec/worker/engine/features.py
PAIRING_FIELDS: tuple[str, ...] = typing.get_args(PairingField)
CACHE_INFO = "vllm:cache_config_info"  # vLLM's: its labels num_gpu_blocks and block_size give the KV size


class InfoUnreadable(Exception):
    """The worker's /metrics could not be read (try again at the next check)."""


def samples(text: str, metric: str) -> list:
    """The samples of one metric in a /metrics text, parsing only that metric's own lines."""
    wanted = (metric + "{", metric + " ", f"# HELP {metric} ", f"# TYPE {metric} ")
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    if not lines:
        return []
    families = text_string_to_metric_families("\n".join(lines) + "\n")
    return [sample for family in families for sample in family.samples if sample.name == metric]


def parse_worker_info(text: str) -> dict[str, str] | None:
    """The labels of the worker's info series, or None when it exports none."""
    return next((dict(s.labels) for s in samples(text, METRIC) if s.value == 1), None)


def parse_features_off(text: str) -> dict[str, str]:
    """The worker's engine features that are off, {feature: reason}."""
    return {
        s.labels.get("feature", "?"): s.labels.get("reason", "")
        for s in samples(text, FEATURE_METRIC)
        if s.value == 1 and s.labels.get("state") == "off"
    }


def parse_kv_tokens(text: str) -> int | None:
    """The worker's KV cache size in tokens: num_gpu_blocks x block_size of its
    `vllm:cache_config_info`, summed over data-parallel engines (their caches are separate);
    None without the series, or with one that says no size (`num_gpu_blocks="None"`)."""
    try:
        size = sum(int(s.labels["num_gpu_blocks"]) * int(s.labels["block_size"]) for s in samples(text, CACHE_INFO))
    except (KeyError, ValueError):
        return None
    return size if size > 0 else None


class WorkerReading(NamedTuple):
    """What a health round reads of a worker's /metrics (`fetch_worker_info`)."""

    info: dict[str, str] | None  # its pdspec_worker_info labels (None: none exported)
    features_off: dict[str, str]  # its engine features that are off, {feature: reason}
    kv_tokens: int | None  # its KV cache size in tokens (None: not exported, as by a stand-in)


async def fetch_metrics_text(
    client: UpstreamClient, url: str, timeout_s: float, headers: dict[str, str] | None = None
) -> str | None:
    """A worker's /metrics text, asked for gzipped (None: it has no /metrics, 404).
    Raises InfoUnreadable when it cannot be read."""
    try:
        response = await client.request(
            url, "GET", "/metrics", headers={"Accept-Encoding": "gzip", **(headers or {})}, timeout_s=timeout_s
        )
        body = await response.read()
    except UpstreamError as exc:
        raise InfoUnreadable(exc.reason) from None
    if response.status == 404:
        return None
    if response.status != 200:
        raise InfoUnreadable(f"/metrics answered {response.status}")
    try:
        if response.headers.get("content-encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
    except (OSError, EOFError) as exc:  # a corrupt gzip body
        raise InfoUnreadable(f"bad /metrics: {exc}") from None
    return body.decode("utf-8", "replace")


async def fetch_worker_info(client: UpstreamClient, url: str, timeout_s: float) -> WorkerReading:
    """The worker's info labels (None: it has /metrics, or none at all: 404, without the
    info, as plain vLLM), its engine features that are off ({feature: reason}) and its KV
    size in tokens (None: unknown; an unparsable cache series only leaves it unknown)."""
    text = await fetch_metrics_text(client, url, timeout_s)
    if text is None:
        return WorkerReading(None, {}, None)
    try:
        return WorkerReading(parse_worker_info(text), parse_features_off(text), parse_kv_tokens(text))
    except ValueError as exc:  # an unparsable series
        raise InfoUnreadable(f"bad /metrics: {exc}") from None
