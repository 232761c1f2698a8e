"""The hand-off probe's summaries (the measuring itself runs in tests/e2e/test_handoff.py)."""

from loadtest.serving import handoff_probe
from loadtest.serving.handoff_probe import XFER_COUNT, medians, metric_means, scrape_after_transfer


def test_medians_per_stage():
    rows = [
        {"proxy_ttft_ms": 100.0, "prefill_leg_ms": 50.0},
        {"proxy_ttft_ms": 300.0, "prefill_leg_ms": 70.0},
        {"proxy_ttft_ms": 200.0, "prefill_leg_ms": 60.0},
    ]
    assert medians(rows) == {"proxy_ttft_ms": 200.0, "prefill_leg_ms": 60.0}


def test_decode_metric_means_are_deltas_over_the_run():
    before = {"vllm:nixl_xfer_time_seconds_sum": 1.0, "vllm:nixl_xfer_time_seconds_count": 4.0}
    after = {
        "vllm:nixl_xfer_time_seconds_sum": 1.03,
        "vllm:nixl_xfer_time_seconds_count": 7.0,
        "vllm:request_queue_time_seconds_sum": 0.6,
        "vllm:request_queue_time_seconds_count": 3.0,
    }
    means = metric_means(before, after)
    assert means["nixl_xfer_time_mean_ms"] == 10.0 and means["request_queue_time_mean_ms"] == 200.0
    assert means["request_prefill_time_mean_ms"] is None  # nothing recorded: no mean, not 0


def test_no_transfers_gives_no_mean():
    assert metric_means({}, {})["nixl_xfer_time_mean_ms"] is None


def test_runs_plot_side_by_side(tmp_path):
    """`--plot LABEL=JSON ...` draws earlier runs' medians, one group of bars per stage."""
    import json

    from loadtest.serving.handoff_probe import STAGES, main

    for name, ms in (("pull", 1500.0), ("push", 120.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"median": {stage: ms for stage in STAGES}}))
    runs = main(
        [
            "--plot",
            f"pull={tmp_path / 'pull.json'}",
            f"push={tmp_path / 'push.json'}",
            "--plot-out",
            str(tmp_path / "stages.png"),
        ]
    )
    assert list(runs) == ["pull", "push"] and runs["push"]["median"]["proxy_ttft_ms"] == 120.0
    assert (tmp_path / "stages.png").stat().st_size > 0


def fake_scrapes(monkeypatch, readings: dict[str, list[dict]]) -> dict[str, int]:
    """worker_metrics.scrape_when_idle returning each side's readings in turn (the last one
    from then on); how many times each was read."""
    reads = {url: 0 for url in readings}

    def scrape(client, url):
        reads[url] += 1
        return readings[url][min(reads[url], len(readings[url])) - 1]

    monkeypatch.setattr(handoff_probe.worker_metrics, "scrape_when_idle", scrape)
    return reads


def test_a_pushed_transfer_counted_late_on_the_prefill_worker_is_waited_for(monkeypatch):
    """The prefill worker posts a pushed KV's transfer and reports it with its engine's next
    stats: the third reading has it, and that reading is what the leg's deltas are taken from."""
    urls = {"decode": "d", "prefill": "p"}
    before = {"decode": {XFER_COUNT: 0.0}, "prefill": {XFER_COUNT: 2.0}}
    reads = fake_scrapes(
        monkeypatch,
        {"d": [{XFER_COUNT: 0.0}], "p": [{XFER_COUNT: 2.0}, {XFER_COUNT: 2.0}, {XFER_COUNT: 3.0, "late": 1.0}]},
    )
    after = scrape_after_transfer(None, urls, before)
    assert after["prefill"] == {XFER_COUNT: 3.0, "late": 1.0} and reads["p"] == 3


def test_a_leg_whose_transfer_is_never_counted_gives_the_metrics_as_they_stand_after_the_timeout(monkeypatch):
    urls = {"decode": "d", "prefill": "p"}
    before = {"decode": {}, "prefill": {}}
    reads = fake_scrapes(monkeypatch, {"d": [{"x": 1.0}], "p": [{}]})
    after = scrape_after_transfer(None, urls, before, timeout_s=0.2)
    assert after == {"decode": {"x": 1.0}, "prefill": {}} and reads["d"] >= 2
