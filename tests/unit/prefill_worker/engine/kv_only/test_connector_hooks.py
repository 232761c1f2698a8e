"""The KV-only pass's connector check (prefill_worker/engine/kv_only/connector_hooks.py)
looks at what the connector's layer hooks do, not at its class name (issue 22: vLLM's
"NixlConnector" is NixlPullConnector)."""

from __future__ import annotations

import pytest

from prefill_worker.engine.kv_only.connector_hooks import busy_layer_hooks, does_nothing


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
