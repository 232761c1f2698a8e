"""The role packages own their roles: prefill_worker/role.py and decode_worker/role.py are
what the settings defaults, the launcher, the vLLM plugin and the engine features read."""

from __future__ import annotations

import pytest

from decode_worker.role import ROLE as DECODE
from pdspec.settings import DecodeWorkerSettings, PrefillWorkerSettings
from pdspec.worker import plugin
from pdspec.worker.engine import features
from pdspec.worker.launch import KV_ROLES
from prefill_worker.role import ROLE as PREFILL


def test_settings_defaults_and_the_launcher_come_from_the_roles():
    for spec, settings in ((PREFILL, PrefillWorkerSettings()), (DECODE, DecodeWorkerSettings())):
        assert (settings.port, settings.side_channel_port, settings.cpu_omp_threads_bind) == (
            spec.port, spec.side_channel_port, spec.cpu_core,
        )  # fmt: skip
        assert KV_ROLES[spec.name] == spec.kv_role
    assert features.ROLE_FEATURES == {"prefill": PREFILL.features, "decode": DECODE.features}
    # Every feature belongs to a role; a prefill worker has all but the decode worker's guard.
    assert set(PREFILL.features) | set(DECODE.features) == set(features.FEATURES)
    assert set(PREFILL.features) == set(features.FEATURES) - {"stale_kv_guard"}
    assert "kv_only_pass" not in DECODE.features and "kv_only" not in DECODE.hooks


@pytest.mark.parametrize("spec", [PREFILL, DECODE])
def test_the_plugin_installs_the_hooks_a_role_lists(spec, monkeypatch):
    installed = []
    for module, name in (("cpu_affinity", "install_cpu_affinity_fix"), ("dp_vote", "install_dp_vote"),
                         ("kv_only", "install_kv_only_drafter"), ("testing_hooks", "install_test_hooks")):  # fmt: skip
        target = __import__(f"pdspec.worker.engine.{module}", fromlist=[name])
        monkeypatch.setattr(target, name, lambda module=module: installed.append(module))
    plugin.install_role_hooks(spec.hooks)
    assert installed == [h for h in ("cpu_affinity", "kv_only", "dp_vote", "testing_hooks") if h in spec.hooks]


def test_an_unknown_hook_is_refused():
    with pytest.raises(ValueError, match="unknown engine hooks"):
        plugin.install_role_hooks(("cpu_affinity", "nonsense"))
