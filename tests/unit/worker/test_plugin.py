"""pdspec's vLLM plugin (pdspec/worker/plugin.py) installs the hooks a role's role.py names,
in that order, and refuses a name that does not resolve before installing anything."""

from __future__ import annotations

import importlib

import pytest

from pdspec.worker import plugin
from pdspec.worker.engine import cpu_affinity
from pdspec.worker.roles import ROLES


@pytest.mark.parametrize("spec", list(ROLES.values()), ids=lambda spec: spec.name)
def test_the_plugin_installs_the_hooks_a_role_names_in_its_order(spec, monkeypatch):
    installed = []
    for hook in spec.hooks:
        module_name, _, function = hook.partition(":")
        monkeypatch.setattr(importlib.import_module(module_name), function, lambda hook=hook: installed.append(hook))
    plugin.install_role_hooks(spec.hooks)
    assert installed == list(spec.hooks) and installed


@pytest.mark.parametrize(
    "bad",
    [
        "pdspec.worker.engine.nonsense:install",
        "pdspec.worker.engine.cpu_affinity:nonsense",
        "pdspec.worker.engine.control:ROLE_ENV",
        "cpu_affinity",
    ],
)
def test_a_hook_that_does_not_resolve_is_refused_and_nothing_is_installed(bad, monkeypatch):
    installed = []
    monkeypatch.setattr(cpu_affinity, "install_cpu_affinity_fix", lambda: installed.append("cpu_affinity"))
    with pytest.raises(ValueError, match="unknown engine hooks"):
        plugin.install_role_hooks(("pdspec.worker.engine.cpu_affinity:install_cpu_affinity_fix", bad))
    assert installed == []


def test_a_failing_import_inside_a_hook_module_is_raised_as_it_is(tmp_path, monkeypatch):
    (tmp_path / "pdspec_test_broken_hook.py").write_text("import pdspec_test_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="pdspec_test_missing_dependency"):
        plugin.install_role_hooks(("pdspec_test_broken_hook:install",))


def test_register_installs_the_hooks_of_the_role_the_launcher_set(monkeypatch):
    from pdspec.worker.engine import cpu_expand_fix, in_core_worker, metrics
    from pdspec.worker.engine.control import ROLE_ENV
    from pdspec.worker.nixl_progress import PROGRESS_DELAY_ENV

    seen = []
    monkeypatch.setattr(plugin, "install_role_hooks", seen.append)
    monkeypatch.setattr(metrics, "install_gc_pause_counter", lambda: None)
    # vLLM's own classes stay as they are for the tests of those hooks.
    monkeypatch.setattr(cpu_expand_fix, "install_cpu_expand_fix", lambda: None)
    monkeypatch.setattr(in_core_worker, "install_in_core_worker", lambda: None)
    monkeypatch.delenv(PROGRESS_DELAY_ENV, raising=False)
    for role in ("prefill", "decode", "colocated"):  # colocated: no role package, nothing installed
        monkeypatch.setenv(ROLE_ENV, role)
        plugin.register()
    assert seen == [ROLES["prefill"].hooks, ROLES["decode"].hooks]
