"""Per-rep readings of the prefill benchmark (loadtest/engine_bench/rep_diagnostics.py)."""

import os

from loadtest.engine_bench.rep_diagnostics import RepProbe, describe, process_stats


def test_process_stats_reads_this_process():
    stats = process_stats(os.getpid())
    assert stats["cpu_s"] > 0 and stats["rss_mib"] > 1 and stats["threads"] >= 1


def test_a_process_that_is_gone_gives_no_readings():
    assert process_stats(2**22 + 12345) == {}


def test_a_rep_reports_the_cpu_it_used_and_the_gc_time_it_added():
    gc_total = iter([1.0, 1.25])
    probe = RepProbe({os.getpid()}, lambda: next(gc_total))
    with probe.rep() as sample:
        sum(i * i for i in range(3_000_000))  # CPU work the probe must see
    assert sample["cpu_s"] > 0 and 0 < sample["engine_cpu_share"] <= 1.5
    assert sample["gc_pause_s"] == 0.25
    line = describe(sample)
    assert "engine cpu" in line and "gc 250 ms" in line


def test_an_engine_that_does_not_count_gc_shows_no_gc_reading():
    """Not measured is not zero: no `gc` in the sample or the line."""
    probe = RepProbe({os.getpid()}, lambda: None)
    with probe.rep() as sample:
        pass
    assert "gc_pause_s" not in sample
    assert not any(part.startswith("gc ") for part in describe(sample).split(", "))


def test_a_rep_names_the_thread_that_used_the_cpu():
    """By its OS name and thread id (a thread that ends before the rep does is not seen)."""
    import threading

    stop, started = threading.Event(), threading.Event()
    native = []

    def spin():
        native.append(threading.get_native_id())
        started.set()
        while not stop.is_set():
            sum(i * i for i in range(10_000))

    worker = threading.Thread(target=spin)
    probe = RepProbe({os.getpid()})
    try:
        with probe.rep() as sample:
            worker.start()
            started.wait(5)
            stop.wait(0.5)  # the worker spins meanwhile
    finally:
        stop.set()
        worker.join()
    names = [name for name, _ in sample["busiest_threads"]]
    assert any(name.endswith(f"/{native[0]}") for name in names), names
    assert f"/{native[0]}" in describe(sample)


def test_the_gpu_sampler_reports_clock_power_and_how_busy_the_gpu_was(monkeypatch):
    """On a stand-in NVML module (pynvml's names): means, minima and the throttle reasons OR-ed."""
    import sys
    import types

    from loadtest.engine_bench.rep_diagnostics import GpuSampler

    readings = iter([(1800, 600_000, 60, 0x0, 98), (1400, 700_000, 70, 0x4, 40)])
    current = {}

    def sample_now(handle):
        current.update(zip(("clock", "power", "temp", "reasons", "busy"), next(readings)))

    nvml = types.SimpleNamespace(
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: "gpu0",
        nvmlDeviceGetClockInfo=lambda handle, kind: (sample_now(handle), current["clock"])[1],
        nvmlDeviceGetPowerUsage=lambda handle: current["power"],
        nvmlDeviceGetTemperature=lambda handle, kind: current["temp"],
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda handle: current["reasons"],
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=current["busy"]),
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = GpuSampler(interval=0.001)
    sampler.start()
    sampler._thread.join(timeout=5)  # the stand-in runs out after two samples, which ends the thread
    reading = sampler.stop()
    assert reading == {
        "sm_clock_mhz_mean": 1600,
        "sm_clock_mhz_min": 1400,
        "power_w_mean": 650,
        "temp_c_max": 70,
        "throttle_reasons": 4.0,
        "gpu_busy_pct_mean": 69,
        "gpu_busy_pct_min": 40,
    }
    assert "gpu busy 69% (min 40%)" in describe(reading) and "throttle 0x4" in describe(reading)
