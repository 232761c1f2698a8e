"""The proxy's metrics over its processes (proxy/shared_metrics.py): processes simulated in
this one, each writing prometheus_client's multiprocess files under its own pid, as the
proxy's processes do with PROMETHEUS_MULTIPROC_DIR set (tests/unit/proxy/test_processes.py
scrapes real ones)."""

import math

import pytest
from prometheus_client import values
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import ProxyMetrics
from proxy.shared_metrics import SharedMetrics


class SimulatedProcess:
    """One of the proxy's processes, simulated: `with process as metrics:` its metrics, whose
    values (a labelled series' made when first used, too) go to files under its own pid."""

    def __init__(self, pid: int) -> None:
        self.value_class = values.MultiProcessValue(lambda: pid)
        with self:
            self.metrics = ProxyMetrics.create(shared=True)

    def __enter__(self) -> ProxyMetrics:
        # prometheus_client picks the value class whenever it makes a series.
        self.saved, values.ValueClass = values.ValueClass, self.value_class
        return getattr(self, "metrics", None)

    def __exit__(self, *exc) -> None:
        values.ValueClass = self.saved


@pytest.fixture
def process(tmp_path, monkeypatch):
    """`process(pid)`: a SimulatedProcess whose files are in `tmp_path`."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    return SimulatedProcess


def scraped(tmp_path) -> dict[tuple, float]:
    """{(sample name, labels): value} of a scrape of any process."""
    text = SharedMetrics(tmp_path).exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_and_histograms_are_summed_over_the_processes(process, tmp_path):
    a, b = process(101), process(102)
    with a as metrics:
        metrics.requests.labels("completions", "200").inc(3)
        metrics.leg_seconds.labels("prefill").observe(0.02)
    with b as metrics:
        metrics.requests.labels("completions", "200").inc(4)
        metrics.leg_seconds.labels("prefill").observe(0.2)
    out = scraped(tmp_path)
    assert out[("pdspec_proxy_requests_total", (("endpoint", "completions"), ("status", "200")))] == 7
    assert out[("pdspec_proxy_leg_seconds_count", (("leg", "prefill"),))] == 2
    assert out[("pdspec_proxy_leg_seconds_bucket", (("le", "0.025"), ("leg", "prefill")))] == 1
    assert out[("pdspec_proxy_leg_seconds_bucket", (("le", "0.25"), ("leg", "prefill")))] == 2


def test_each_gauge_combines_by_its_mode(process, tmp_path):
    for pid, inflight, healthy, lag in ((101, 2, 2, 0.1), (102, 5, 1, 0.4)):
        with process(pid) as metrics:
            metrics.inflight.set(inflight)  # livesum: what each process holds
            metrics.healthy_workers.labels("prefill").set(healthy)  # livemin: one process's ejection counts
            metrics.kv_event_lag.labels("http://w").set(lag)  # livemax: the worst view
    out = scraped(tmp_path)
    assert out[("pdspec_proxy_inflight_requests", ())] == 7
    assert out[("pdspec_proxy_healthy_workers", (("pool", "prefill"),))] == 1
    assert out[("pdspec_proxy_kv_event_lag_seconds", (("worker", "http://w"),))] == 0.4
    assert SharedMetrics(tmp_path).value("pdspec_proxy_inflight_requests") == 7  # /load's number
    assert not [key for key in out if "pid" in dict(key[1])]


def test_a_removed_series_leaves_the_scrape_once_every_process_removed_it(process, tmp_path):
    a, b = process(101), process(102)
    for proc, blocks in ((a, 10), (b, 12)):
        with proc as metrics:
            metrics.kv_index_blocks.labels("http://w").set(blocks)
    key = ("pdspec_proxy_kv_index_blocks", (("worker", "http://w"),))
    with a as metrics:
        metrics.remove_series(metrics.kv_index_blocks, "http://w")
    assert scraped(tmp_path)[key] == 12  # b still holds its view
    with b as metrics:
        metrics.remove_series(metrics.kv_index_blocks, "http://w")
    assert key not in scraped(tmp_path)
    with a as metrics:
        metrics.kv_index_blocks.labels("http://w").set(3)  # the worker is back
    assert scraped(tmp_path)[key] == 3


def test_set_series_drops_the_workers_that_left(process, tmp_path):
    with process(101) as metrics:
        metrics.set_series(metrics.worker_inflight, {("decode", "http://d1"): 2, ("decode", "http://d2"): 1})
        metrics.set_series(metrics.worker_inflight, {("decode", "http://d2"): 4})
    workers = {dict(k[1])["worker"]: v for k, v in scraped(tmp_path).items() if k[0] == "pdspec_proxy_worker_inflight"}
    assert workers == {"http://d2": 4}


def test_a_dead_process_keeps_its_counts_and_loses_its_gauges(process, tmp_path):
    with process(101) as metrics:
        metrics.requests.labels("chat", "200").inc(2)
        metrics.inflight.set(3)
    with process(102) as metrics:
        metrics.inflight.set(1)
    mark_process_dead(101, str(tmp_path))  # what the parent does when a process exits
    out = scraped(tmp_path)
    assert out[("pdspec_proxy_requests_total", (("endpoint", "chat"), ("status", "200")))] == 2
    assert out[("pdspec_proxy_inflight_requests", ())] == 1


def test_every_metric_of_a_process_reaches_the_shared_scrape(process, tmp_path):
    """Nothing the proxy exports is lost when its values live in files: a gauge with a
    function behind it, or without a mode that combines, would be."""
    with process(101) as metrics:
        for name in vars(metrics):
            metric = getattr(metrics, name)
            if not hasattr(metric, "_type"):
                continue  # the registry, the flag
            series = metric.labels(*("x" for _ in metric._labelnames)) if metric._labelnames else metric
            touch = {"counter": "inc", "gauge": "set", "histogram": "observe"}[metric._type]
            getattr(series, touch)(1)
    own = {family.name for family in metrics.registry.collect() if family.samples}
    shared = {family.name for family in SharedMetrics(tmp_path).registry.collect()}
    assert own == shared
    out = scraped(tmp_path)
    assert not [key for key, value in out.items() if math.isnan(value) or "pid" in dict(key[1])]
