"""pdspec/worker/engine/features.py and connector_hooks.py: each engine feature reports
its state, and the KV-only pass's connector check looks at what the hooks do, not at the
connector's class name (issue 22: vLLM's "NixlConnector" is NixlPullConnector)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from pdspec.worker.engine import features
from pdspec.worker.engine.connector_hooks import busy_layer_hooks, does_nothing
from pdspec.worker.engine.k0_scheduler import _k0_rule_state


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


def test_every_role_names_only_features_that_exist():
    known = {features.K0_RULE, features.KV_ONLY_PASS, features.NIXL_PROGRESS_DELAY, features.KV_CORE_PINNING,
             features.DP_IDLE_RANK_VOTE, features.STALE_KV_GUARD, features.KV_HOLD_WAIT,
             features.SHORT_SPIN, features.PREFILL_REPLY_GUARD}  # fmt: skip
    assert set(features.ROLE_FEATURES["prefill"]) == known - {features.STALE_KV_GUARD}
    assert set(features.ROLE_FEATURES["decode"]) < known and features.KV_ONLY_PASS not in features.ROLE_FEATURES["decode"]
    assert features.STALE_KV_GUARD in features.ROLE_FEATURES["decode"]
    assert features.KV_HOLD_WAIT not in features.ROLE_FEATURES["decode"]  # a decode worker holds no KV for reads
    assert features.PREFILL_REPLY_GUARD not in features.ROLE_FEATURES["decode"]


class Quiet:
    def wait_for_layer_load(self, layer_name):
        """Nothing per layer."""

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass


class Saving(Quiet):
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self.saved = layer_name


class ReturnsSomething(Quiet):
    def wait_for_layer_load(self, layer_name):
        return 1


def test_empty_hooks_do_nothing_and_any_body_does_something():
    assert busy_layer_hooks(Quiet()) == []
    assert busy_layer_hooks(Saving()) == ["Saving.save_kv_layer"]
    assert busy_layer_hooks(ReturnsSomething()) == ["ReturnsSomething.wait_for_layer_load"]
    assert not does_nothing(len)  # no Python code to read: not known to be empty


def test_vllms_nixl_connector_is_allowed_whatever_its_class_is_called():
    """The defect: the check compared the class name with "NixlConnector", and vLLM's
    NixlConnector is NixlPullConnector, so every P/D prefill worker ran the full pass."""
    nixl = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector")
    assert nixl.NixlConnector.__name__ != "NixlConnector"  # why a name check cannot work
    connector = nixl.NixlConnector.__new__(nixl.NixlConnector)
    assert busy_layer_hooks(connector) == []


def test_a_connector_that_wraps_others_keeps_the_full_pass():
    multi = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.multi_connector")
    connector = multi.MultiConnector.__new__(multi.MultiConnector)
    assert busy_layer_hooks(connector) == ["MultiConnector.wait_for_layer_load", "MultiConnector.save_kv_layer"]


@pytest.mark.parametrize(
    "active, native, dp, on, fragment",
    [(True, False, 1, True, ""), (True, True, 2, True, ""), (False, False, 1, False, "no forward"),
     (True, False, 2, False, "data parallelism")],
)  # fmt: skip
def test_the_k0_rule_reports_why_it_is_off(active, native, dp, on, fragment):
    state, reason = _k0_rule_state(active, native, dp, type("Spec", (), {"method": "ngram"})())
    assert state is on and fragment in reason
