"""The live settings files a running engine reads (pdspec/worker/engine/control.py): the
drafts policy and the KV-only switch."""

import os

from pdspec.worker.engine import control
from pdspec.worker.engine.control import DraftsPolicySource, LiveFlag, write_policy


def test_policy_file_switches_a_running_engine(tmp_path):
    path = tmp_path / "drafts-policy"
    source = DraftsPolicySource("auto", path)
    assert source.current() == "auto"  # no file yet: the start-up setting
    write_policy(path, "always")
    assert source.current() == "always"
    write_policy(path, "auto")
    os.utime(path, ns=(1, 1))  # make sure the change is seen even within one mtime tick
    assert source.current() == "auto"


def test_unknown_policy_keeps_the_current_one(tmp_path):
    path = tmp_path / "drafts-policy"
    path.write_text("sometimes")
    assert DraftsPolicySource("always", path).current() == "always"


def test_live_flag_follows_its_file(tmp_path):
    path = tmp_path / "kv-only"
    flag = LiveFlag(True, path)
    assert flag.current() is True  # no file: the start-up value
    write_policy(path, "off")
    assert flag.current() is False
    path.write_text("maybe")
    os.utime(path, ns=(1, 1))
    assert flag.current() is False  # unknown text: keeps the last value
    write_policy(path, "on")
    assert flag.current() is True


def test_start_value_from_environment(monkeypatch):
    monkeypatch.delenv(control.KV_ONLY_FILE_ENV, raising=False)
    monkeypatch.setenv(control.KV_ONLY_ENV, "0")
    assert LiveFlag.kv_only_from_env().current() is False
    monkeypatch.setenv(control.KV_ONLY_ENV, "1")
    assert LiveFlag.kv_only_from_env().current() is True
