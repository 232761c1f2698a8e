"""`pdspec_worker_info`: what a worker really runs with, on its own /metrics.

A gauge of 1 whose labels are the worker's role and the engine's resolved config (target
model, drafter, method, K, KV block size, vLLM version) and its live drafts policy. The
proxy reads it to refuse pairing a prefill and a decode worker whose KV would not fit
(proxy/fleet/pairing.py); dashboards use it to split panels by role.

Written by pdspec's scheduler in vLLM's engine-core process, from the config the engine
built (the block size after the platform resolved it, not pdspec's settings), and
rewritten when the drafts policy changes. Why a file of its own: the API server serves
/metrics from prometheus-client's multiprocess files, and a multiprocess gauge cannot
drop a label set, so a policy change would leave the old series behind. This module
writes the gauge's file in the multiprocess format itself and replaces it whole: the old
series disappears with the old file. The file name gives the gauge mode `mostrecent`
(no `pid` label on the merged series).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from pdspec.contract import KV_EVENTS_LABELS, WORKER_INFO_METRIC

log = logging.getLogger("pdspec.worker_info")

METRIC = WORKER_INFO_METRIC
HELP = "1 per worker; labels: its role and the config its engine runs with."
LABELS = (
    "role",
    "model",
    "drafter",
    "method",
    "num_speculative_tokens",
    "block_size",
    "kv_connector",
    "vllm_version",
    "drafts_policy",
    *KV_EVENTS_LABELS,
)
# `gauge_<mode>_<id>.db` is how prometheus-client's collector learns a gauge's mode.
INFO_FILE = "gauge_mostrecent_pdspecinfo.db"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def labels_from_config(vllm_config: Any, role: str, drafts_policy: str) -> dict[str, str]:
    """The labels, from the engine's own config (speculative config as vLLM resolved it)."""
    import vllm

    spec = vllm_config.speculative_config
    return {
        "role": role,
        "model": str(vllm_config.model_config.model),
        "drafter": str(spec.model or "") if spec is not None else "",
        "method": str(spec.method) if spec is not None else "none",
        "num_speculative_tokens": str(spec.num_speculative_tokens if spec is not None else 0),
        "block_size": str(vllm_config.cache_config.block_size),
        # Pull and push workers cannot pair: a push decode worker waits for a WRITE that a
        # pull prefill worker never sends.
        "kv_connector": kv_connector_label(getattr(vllm_config, "kv_transfer_config", None)),
        "vllm_version": vllm.__version__,
        "drafts_policy": drafts_policy,
        **kv_events_labels(getattr(vllm_config, "kv_events_config", None)),
    }


def kv_connector_label(config: Any) -> str:
    """The KV connector's direction: pull, push, or empty without one. vLLM's NixlConnector
    is its pull connector under an older name."""
    name = str(getattr(config, "kv_connector", "") or "")
    return {"NixlConnector": "pull", "NixlPullConnector": "pull", "NixlPushConnector": "push"}.get(name, name)


def kv_events_labels(config: Any) -> dict[str, str]:
    """Where the engine publishes its KV-cache events, as configured (`tcp://*:5650`: the
    proxy reads the worker's own host for `*`); empty strings when it does not."""
    on = config is not None and getattr(config, "enable_kv_cache_events", False) and config.publisher == "zmq"
    values = (config.endpoint, config.replay_endpoint or "", config.topic) if on else ("", "", "")
    return dict(zip(KV_EVENTS_LABELS, values))


def publish(directory: Path, labels: dict[str, str]) -> None:
    """Replace the worker's info series (atomically: a scrape sees the old or the new)."""
    names = list(LABELS)
    key = mmap_key(METRIC, METRIC, names, [labels.get(name, "") for name in names], HELP)
    # Not *.db, and one per process: the collector never reads a half-written file, and
    # two writers (several engine-core ranks, `pdspec drafts`) never share one.
    tmp = directory / f"pdspec-worker-info.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    values = MmapedDict(str(tmp))
    try:
        values.write_value(key, 1.0, time.time())
    finally:
        values.close()
    os.replace(tmp, directory / INFO_FILE)


def read(directory: Path) -> dict[str, str] | None:
    """The published labels, or None when nothing was published there."""
    path = directory / INFO_FILE
    if not path.exists():
        return None
    for metric in MultiProcessCollector.merge([str(path)]):
        for sample in metric.samples:
            if sample.name == METRIC:
                return dict(sample.labels)
    return None


def follow_policy(directory: Path, drafts_policy: str) -> bool:
    """Rewrite the published series with a new drafts policy (`pdspec drafts`); False
    when the worker published none (started without pdspec's engine plugin)."""
    labels = read(directory)
    if labels is None:
        return False
    if labels.get("drafts_policy") != drafts_policy:
        publish(directory, {**labels, "drafts_policy": drafts_policy})
    return True


class WorkerInfo:
    """The engine-core side: publish at start, re-publish when the policy changes."""

    def __init__(self, labels: dict[str, str], directory: Path | None) -> None:
        self.labels = labels
        self.directory = directory

    @classmethod
    def start(cls, vllm_config: Any, role: str, drafts_policy: str) -> WorkerInfo:
        labels = labels_from_config(vllm_config, role, drafts_policy)
        directory = os.environ.get(MULTIPROC_ENV)
        info = cls(labels, Path(directory) if directory else None)
        if info.directory is None:
            log.warning("pdspec: %s is unset, so %s is not exported", MULTIPROC_ENV, METRIC)
        else:
            info._publish()
            log.info("pdspec: %s %s", METRIC, labels)
        return info

    def _publish(self) -> None:
        try:
            publish(self.directory, self.labels)
        except OSError as exc:  # a metric is not worth stopping the engine for
            log.error("pdspec: cannot write %s in %s: %s", METRIC, self.directory, exc)

    def policy_changed(self, drafts_policy: str) -> None:
        """Called by the engine once per step with the policy it applies (cheap when equal)."""
        if drafts_policy == self.labels["drafts_policy"]:
            return
        self.labels = {**self.labels, "drafts_policy": drafts_policy}
        if self.directory is not None:
            self._publish()
