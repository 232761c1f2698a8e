"""The role packages own their roles: prefill_worker/role.py and decode_worker/role.py
(read by pdspec/worker/roles.py) are what the settings defaults, the launcher, the vLLM
plugin and the engine features read."""

from __future__ import annotations

import importlib
import types

import pytest

from decode_worker import role as decode_role
from pdspec.settings import DecodeWorkerSettings, PrefillWorkerSettings
from pdspec.worker import plugin
from pdspec.worker.engine import features
from pdspec.worker.launch import KV_ROLES, SCHEDULER_CLS, scheduler_cls
from pdspec.worker.role_spec import RoleSpec
from pdspec.worker.roles import ROLE_FEATURES, ROLES
from prefill_worker import role as prefill_role

PREFILL, DECODE = ROLES["prefill"], ROLES["decode"]


def test_settings_defaults_and_the_launcher_come_from_the_roles():
    for spec, settings in ((PREFILL, PrefillWorkerSettings()), (DECODE, DecodeWorkerSettings())):
        assert (settings.port, settings.side_channel_port, settings.kv_events_port, settings.cpu_omp_threads_bind) == (
            spec.port,
            spec.side_channel_port,
            spec.kv_events_port,
            spec.cpu_core,
        )
        assert KV_ROLES[spec.name] == spec.kv_role
        assert scheduler_cls(spec.name) == spec.scheduler_cls
    assert scheduler_cls("colocated") == SCHEDULER_CLS  # no role package: the plain K=0 scheduler
    assert (PREFILL.name, PREFILL.port, DECODE.name, DECODE.port) == (
        prefill_role.NAME,
        prefill_role.PORT,
        decode_role.NAME,
        decode_role.PORT,
    )
    assert ROLE_FEATURES == {"prefill": PREFILL.features, "decode": DECODE.features}
    # Every feature belongs to a role; a prefill worker has all but the decode worker's guard.
    assert set(PREFILL.features) | set(DECODE.features) == set(features.FEATURES)
    assert set(PREFILL.features) == set(features.FEATURES) - {"stale_kv_guard"}
    assert "kv_only_pass" not in DECODE.features and not [h for h in DECODE.hooks if "kv_only" in h]


def test_every_role_names_only_features_that_exist():
    known = {
        features.K0_RULE,
        features.KV_ONLY_PASS,
        features.NIXL_PROGRESS_DELAY,
        features.KV_CORE_PINNING,
        features.DP_IDLE_RANK_VOTE,
        features.STALE_KV_GUARD,
        features.KV_HOLD_WAIT,
        features.SHORT_SPIN,
        features.CPU_EXPAND_FIX,
        features.IN_CORE_WORKER,
        features.PREFILL_REPLY_GUARD,
    }
    assert set(ROLE_FEATURES["prefill"]) == known - {features.STALE_KV_GUARD}
    assert set(ROLE_FEATURES["decode"]) < known and features.KV_ONLY_PASS not in ROLE_FEATURES["decode"]
    assert features.STALE_KV_GUARD in ROLE_FEATURES["decode"]
    assert features.KV_HOLD_WAIT not in ROLE_FEATURES["decode"]  # a decode worker holds no KV for reads
    assert features.PREFILL_REPLY_GUARD not in ROLE_FEATURES["decode"]


@pytest.mark.parametrize("spec", [PREFILL, DECODE], ids=lambda spec: spec.name)
def test_each_role_names_engine_code_that_exists_shared_or_its_own(spec):
    own = f"{spec.name}_worker.engine."
    for hook in spec.hooks:
        assert callable(plugin._resolve(hook)), hook
        assert hook.startswith(("pdspec.worker.engine.", own)), hook  # never the other role's
    for hook in spec.server_hooks:  # the API server's: the role's own package
        assert callable(plugin._resolve(hook)), hook
        assert hook.startswith(f"{spec.name}_worker."), hook
    module_name, _, class_name = spec.scheduler_cls.rpartition(".")
    scheduler = getattr(importlib.import_module(module_name), class_name)
    from pdspec.worker.engine.k0_scheduler import K0Scheduler

    assert issubclass(scheduler, K0Scheduler)  # the K=0 rule, whatever the role adds


def test_a_role_module_without_one_of_the_constants_is_refused():
    partial = types.ModuleType("half_a_role")
    for name in (
        "NAME",
        "KV_ROLE",
        "PORT",
        "SIDE_CHANNEL_PORT",
        "KV_EVENTS_PORT",
        "CPU_CORE",
        "FEATURES",
        "HOOKS",
        "SERVER_HOOKS",
    ):
        setattr(partial, name, getattr(prefill_role, name))
    with pytest.raises(AttributeError, match="SCHEDULER_CLS"):
        RoleSpec.from_module(partial)
    partial.SCHEDULER_CLS = prefill_role.SCHEDULER_CLS
    assert RoleSpec.from_module(partial) == PREFILL
