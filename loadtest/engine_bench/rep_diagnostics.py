"""What else changed during a benchmark rep, beside its tokens/s: the engine process's CPU
time (and its three busiest threads), context switches, memory and GC pauses, and (on a
GPU) the SM clock, power and temperature. For a drift that slows one engine rep by rep while its neighbour holds steady
(kv_only/h200-prefill-worker-32: the drafter engine at mbt 512), these say whether the
engine's host side, its garbage or the GPU's clocks moved with it.

`RepProbe(pids)` around a rep: `with probe.rep() as sample: ...` fills `sample` (a dict)
when the rep ends. Everything it reads is optional: a value it cannot read is left out.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(stat: str) -> float:
    """User + system CPU seconds from a /proc `stat` line (a process's or a thread's)."""
    fields = stat.rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def process_stats(pid: int) -> dict[str, float]:
    """CPU seconds (user + system, all threads), context switches and RSS of one process."""
    stats: dict[str, float] = {}
    try:
        stats["cpu_s"] = _cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                stats[key] = float(value)
            elif key == "VmRSS":
                stats["rss_mib"] = float(value.split()[0]) / 1024
            elif key == "Threads":
                stats["threads"] = float(value)
    except (OSError, IndexError, ValueError):
        pass
    return stats


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of one process, keyed `name/tid` (the thread's comm: vLLM
    and NIXL name theirs), so a rep can say which thread took the time."""
    threads: dict[str, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return threads
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
            threads[f"{name}/{task.name}"] = _cpu_seconds((task / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return threads


def busiest_threads(before: dict[str, float], after: dict[str, float], count: int = 3) -> list[tuple[str, float]]:
    """The `count` threads that used the most CPU between two readings (new threads in full)."""
    used = {name: seconds - before.get(name, 0.0) for name, seconds in after.items()}
    return sorted(((n, s) for n, s in used.items() if s > 0), key=lambda item: -item[1])[:count]


class GpuSampler:
    """Samples GPU 0's SM clock, power, temperature and busy share every `interval` s (NVML),
    between start() and stop(); nothing when NVML or a GPU is missing. The busy share (NVML's
    "utilization": the part of the last sample period in which a kernel ran) separates a
    slow rep whose GPU waited on the host (busy well under 100%) from one whose GPU ran
    slower (busy near 100%, the clock down)."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.samples: list[tuple[float, float, float, int, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML, no GPU: the probe reports no GPU values
            self._nvml = None

    def start(self) -> None:
        if self._handle is None:
            return
        self.samples = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nvml = self._nvml
        while not self._stop.wait(self.interval):
            try:
                self.samples.append(
                    (
                        nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM),
                        nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000,
                        nvml.nvmlDeviceGetTemperature(self._handle, nvml.NVML_TEMPERATURE_GPU),
                        nvml.nvmlDeviceGetCurrentClocksThrottleReasons(self._handle),
                        nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu,
                    )
                )
            except Exception:
                return

    def stop(self) -> dict[str, float]:
        if self._thread is None:
            return {}
        self._stop.set()
        self._thread.join()
        self._thread = None
        if not self.samples:
            return {}
        clocks, power, temp, reasons, busy = zip(*self.samples)
        throttled = 0
        for r in reasons:
            throttled |= r
        return {
            "sm_clock_mhz_mean": sum(clocks) / len(clocks),
            "sm_clock_mhz_min": min(clocks),
            "power_w_mean": sum(power) / len(power),
            "temp_c_max": max(temp),
            "throttle_reasons": float(throttled),
            "gpu_busy_pct_mean": sum(busy) / len(busy),
            "gpu_busy_pct_min": min(busy),
        }


class RepProbe:
    """Engine-process and GPU readings over one rep (deltas for the cumulative ones)."""

    def __init__(self, pids: frozenset[int] | set[int], gc_seconds=None) -> None:
        """`gc_seconds`: a callable giving the engine's GC pause seconds so far (its
        `pdspec_engine_gc_pause_seconds_total`, None where it has none), or None. GC time
        reaches the counter within a second (metrics.py), so a rep's share is approximate."""
        self.pids = sorted(pids)
        self.gc_seconds = gc_seconds
        self.gpu = GpuSampler()

    def _read(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for pid in self.pids:
            for key, value in process_stats(pid).items():
                total[key] = total.get(key, 0.0) + value
        gc_seconds = self.gc_seconds() if self.gc_seconds is not None else None
        if gc_seconds is not None:  # None: the engine does not count GC pauses (not measured, not zero)
            total["gc_pause_s"] = gc_seconds
        return total

    def _threads(self) -> dict[str, float]:
        return {f"{pid}:{name}": cpu for pid in self.pids for name, cpu in thread_cpu(pid).items()}

    @contextmanager
    def rep(self) -> Iterator[dict]:
        sample: dict = {}
        before = self._read()
        threads_before = self._threads()
        self.gpu.start()
        start = time.perf_counter()
        try:
            yield sample
        finally:
            wall = time.perf_counter() - start
            gpu = self.gpu.stop()
            after = self._read()
            for key in ("cpu_s", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches", "gc_pause_s"):
                if key in after and key in before:
                    sample[key] = after[key] - before[key]
            if "cpu_s" in sample and wall > 0:
                sample["engine_cpu_share"] = sample["cpu_s"] / wall
            for key in ("rss_mib", "threads"):
                if key in after:
                    sample[key] = after[key]
            busiest = busiest_threads(threads_before, self._threads())
            if busiest:  # [["comm/tid", CPU seconds], ...]: which engine threads the CPU share came from
                sample["busiest_threads"] = [[name.split(":", 1)[1], round(cpu, 2)] for name, cpu in busiest]
            sample.update(gpu)


def describe(sample: dict) -> str:
    """One short line of a rep's readings, for the progress output."""
    parts = []
    if "engine_cpu_share" in sample:
        parts.append(f"engine cpu {sample['engine_cpu_share']:.2f}")
    if "gc_pause_s" in sample:
        parts.append(f"gc {sample['gc_pause_s'] * 1000:.0f} ms")
    if "nonvoluntary_ctxt_switches" in sample:
        parts.append(f"preempted {sample['nonvoluntary_ctxt_switches']:.0f}")
    if "rss_mib" in sample:
        parts.append(f"rss {sample['rss_mib']:.0f} MiB")
    if sample.get("busiest_threads"):
        parts.append("threads " + " ".join(f"{name} {cpu:.1f}s" for name, cpu in sample["busiest_threads"]))
    if "sm_clock_mhz_mean" in sample:
        parts.append(
            f"sm {sample['sm_clock_mhz_mean']:.0f} MHz (min {sample['sm_clock_mhz_min']:.0f})"
            f" {sample['power_w_mean']:.0f} W {sample['temp_c_max']:.0f} C"
            f" throttle 0x{int(sample['throttle_reasons']):x}"
        )
    if "gpu_busy_pct_mean" in sample:
        parts.append(f"gpu busy {sample['gpu_busy_pct_mean']:.0f}% (min {sample['gpu_busy_pct_min']:.0f}%)")
    return ", ".join(parts)
