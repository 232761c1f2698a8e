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
