"""routing_compare: runs of the routing benchmark side by side (table and plot)."""

import json

import pytest

from loadtest.serving.routing_compare import load, main, rows


def report(command: str, *runs: tuple[str, str, float, float]) -> dict:
    return {
        "command": command,
        "runs": [
            {"workload": w, "policy": p, "prefill_hit_rate": 0.5, "ttft_ms": {"median": p50, "p90": p90}}
            for w, p, p50, p90 in runs
        ],
    }


def test_every_pair_of_any_run_gets_a_row_and_a_missing_one_a_dash(tmp_path):
    before = tmp_path / "a.json"
    after = tmp_path / "b.json"
    before.write_text(json.dumps(report("x", ("shared", "rr", 600, 2200), ("shared", "kv", 300, 1800))))
    after.write_text(json.dumps(report("y", ("shared", "kv", 180, 310), ("multi", "kv", 150, 450))))
    runs = load([f"before={before}", f"after={after}"])
    assert [(w, p, sorted(by)) for w, p, by in rows(runs)] == [
        ("shared", "rr", ["before"]),
        ("shared", "kv", ["after", "before"]),
        ("multi", "kv", ["after"]),
    ]
    out = tmp_path / "cmp.png"
    text = main(["--out", str(out), f"before={before}", f"after={after}"])
    assert "| shared | kv | 300 / 1800, 0.50 | 180 / 310, 0.50 |" in text
    assert "| shared | rr | 600 / 2200, 0.50 | - |" in text
    assert out.stat().st_size > 0 and out.with_suffix(".md").read_text() == text


def test_a_run_without_a_label_is_refused():
    with pytest.raises(SystemExit, match="LABEL=PATH"):
        load(["results.json"])
