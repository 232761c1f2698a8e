"""prefill_bench's reporting: interleaving order, the table and the baseline lines."""

from loadtest.prefill_bench import BenchResult, baseline_lines, render, rep_orders


def test_reps_alternate_the_order_of_modes():
    assert rep_orders(["auto", "full", "none"], 3) == [
        ["auto", "full", "none"], ["none", "full", "auto"], ["auto", "full", "none"]
    ]  # fmt: skip


def test_baseline_line_is_the_ratio_of_medians():
    counters = {"pdspec_k0_proposals_total": 4.0, "pdspec_proposals_total": 4.0}
    r = BenchResult(512, 32, 2048, tokens_per_s={"auto": [90.0, 95.0, 80.0], "full": [70.0] * 3,
                                                  "none": [100.0, 100.0, 120.0]},
                    counters={"auto": counters, "full": counters, "none": {}})  # fmt: skip
    assert baseline_lines([r]) == ["mbt 512: k0/no-drafter: 0.900"]
    table = render([r])
    assert "| 512 | 90 | 70 | 100 |" in table
    assert "auto/none (pairs)" in table and "0.900 (0.667..0.950)" in table
    assert "4 / 4" in table


def test_no_baseline_line_without_the_plain_engine():
    r = BenchResult(512, 1, 1, tokens_per_s={"auto": [1.0], "always": [1.0]},
                    counters={"auto": {"pdspec_k0_proposals_total": 1, "pdspec_proposals_total": 1},
                              "always": {"pdspec_k0_proposals_total": 0, "pdspec_proposals_total": 1}})  # fmt: skip
    assert baseline_lines([r]) == []
    assert r.ratio == 1.0
