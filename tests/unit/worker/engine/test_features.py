"""pdspec/worker/engine/features.py: each engine feature reports its state, and a change of
state zeroes the old series."""

from __future__ import annotations

from prometheus_client import generate_latest

from pdspec.worker.engine import features


def gauge_lines(feature: str) -> list[str]:
    text = generate_latest().decode()
    return [line for line in text.splitlines() if line.startswith("pdspec_engine_feature{") and feature in line]


def test_a_feature_reports_its_state_and_a_change_zeroes_the_old_one():
    features.report("test_feature", True)
    assert features.reported()["test_feature"] == ("on", "")
    assert any('state="on"' in line and line.endswith(" 1.0") for line in gauge_lines("test_feature"))
    features.report("test_feature", False, "it failed")
    lines = gauge_lines("test_feature")
    assert any('state="on"' in line and line.endswith(" 0.0") for line in lines)
    assert any('reason="it failed"' in line and line.endswith(" 1.0") for line in lines)
