"""The proxy's metrics over all its processes (`proxy.workers` > 1, proxy/processes.py).

With several processes on one port, a Prometheus scrape of `/metrics` reaches whichever
process the kernel hands the connection to, so every process must answer for all of them.
Each writes its values to prometheus_client's multiprocess files in one folder (the
parent sets `PROMETHEUS_MULTIPROC_DIR` before a process starts, so prometheus_client
keeps every value there), and `SharedMetrics` reads the whole folder at each scrape:
- counters and histograms are summed over the processes, those of a process that died
  included (what it counted happened; a restarted process starts files of its own);
- each gauge combines the processes' values by its `multiprocess_mode` (proxy/metrics.py
  gives every gauge a `livesum`, `livemin` or `livemax` one), over the processes alive
  (the parent drops a dead process's gauge files, `mark_process_dead`).

prometheus_client cannot delete a series from its files (`Gauge.remove` only forgets it in
memory, and the file keeps its last value for ever), so a process removes a gauge's series
by writing `REMOVED` (NaN) to it, and a process's NaN is left out before the processes'
values are combined: a worker that left is gone from the scrape once every process
dropped it, and a worker one process still sees keeps that process's value. Anything else
(`all`, `mostrecent` gauges) is combined by prometheus_client's own collector.

Not exported here: counters' `_created` samples (prometheus_client's multiprocess files do
not keep them). With one process (`proxy.workers` = 1) none of this runs: its registry is
scraped as it is.
"""

from __future__ import annotations

import glob
import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

# What a process writes to a gauge's series it removed: left out of the combined value.
REMOVED = math.nan

_COMBINE: dict[str, Callable[[Iterable[float]], float]] = {"sum": math.fsum, "min": min, "max": max}


class ProcessesCollector:
    """A Prometheus collector of every process's values in `path` (see the module's docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def collect(self) -> Iterable[Metric]:
        files = glob.glob(os.path.join(self.path, "*.db"))
        combined_gauges: dict[str, list[str]] = defaultdict(list)  # mode -> its files
        others = []
        for file in files:
            kind, _, rest = os.path.basename(file).partition("_")
            mode = rest.rpartition("_")[0].removeprefix("live") if kind == "gauge" else ""
            (combined_gauges[mode] if mode in _COMBINE else others).append(file)
        yield from MultiProcessCollector.merge(others, accumulate=True)
        for mode, mode_files in combined_gauges.items():
            yield from _combine_gauges(mode_files, _COMBINE[mode])


def _combine_gauges(files: list[str], combine: Callable[[Iterable[float]], float]) -> Iterable[Metric]:
    """Gauges of one mode, combined over the processes' files (one file per process), each
    process's removed series (NaN) left out."""
    families: dict[str, Metric] = {}
    values: dict[tuple, list[float]] = defaultdict(list)  # (family, sample, labels) -> each process's value
    for file in files:
        try:
            metrics = MultiProcessCollector.merge([file], accumulate=False)
        except FileNotFoundError:  # its process died and the parent dropped its files since the glob
            continue
        for metric in metrics:
            families.setdefault(metric.name, Metric(metric.name, metric.documentation, metric.type))
            for sample in metric.samples:
                if not math.isnan(sample.value):
                    values[(metric.name, sample.name, tuple(sorted(sample.labels.items())))].append(sample.value)
    for (family, name, labels), process_values in values.items():
        families[family].add_sample(name, dict(labels), combine(process_values))
    return [family for family in families.values() if family.samples]


class SharedMetrics:
    """What one process of several answers on /metrics: every process's metrics, combined."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ProcessesCollector(self.path))

    def exposition(self) -> bytes:
        """The scrape's body (Prometheus text format)."""
        return generate_latest(self.registry)

    def value(self, name: str) -> float | None:
        """One unlabelled gauge's value over the processes (None: no process has it)."""
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name == name and not sample.labels:
                    return sample.value
        return None
