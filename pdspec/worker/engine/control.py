"""The files and environment that steer a running engine: the names, and readers of
live settings that need no vLLM and no metrics (the launcher, the CLI and the
benchmarks import this module, never the engine hooks).

- the drafts policy (`auto` | `always`) starts from `PDSPEC_DRAFTS` and is re-read from
  the file named by `PDSPEC_DRAFTS_FILE` every engine step (`pdspec drafts` writes it);
- the KV-only drafter pass starts from `PDSPEC_KV_ONLY_DRAFTER` and can be switched through
  `PDSPEC_KV_ONLY_DRAFTER_FILE` (`on` / `off`; tests and benchmarks);
- `PDSPEC_ROLE` names the worker's role for the plugin; `PDSPEC_DP_IDLE_RANK_VOTE` picks
  pdspec's or vLLM's vote of an idle data-parallel rank; the test-only switch names a file
  whose presence stops a prefill worker writing drafter KV, and the test-only dump folder,
  while it exists, receives the drafter KV a decode worker pulled over NIXL.
A file that cannot be read, or holds an unknown value, keeps the last good value (logged).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pdspec.contract import DRAFTS_POLICIES, DraftsPolicy

log = logging.getLogger("pdspec.engine")

DRAFTS_ENV = "PDSPEC_DRAFTS"  # initial policy
DRAFTS_FILE_ENV = "PDSPEC_DRAFTS_FILE"  # file holding the live policy, re-read per step
ROLE_ENV = "PDSPEC_ROLE"
STALE_KV_AFTER_ENV = "PDSPEC_STALE_KV_AFTER_S"  # decode worker: stale_kv.py's age limit (unset: off)
DP_IDLE_RANK_VOTE_ENV = "PDSPEC_DP_IDLE_RANK_VOTE"  # "1" (default) or "0": vLLM's own vote
KV_HOLD_POLL_ENV = "PDSPEC_KV_HOLD_POLL_S"  # prefill worker: kv_hold_wait.py's wait (0 or unset: off)
SPIN_WINDOW_ENV = "PDSPEC_SPIN_WINDOW_MS"  # CPU builds: short_spin.py's window (0 or unset: off)
IN_CORE_WORKER_ENV = "PDSPEC_IN_CORE_WORKER"  # CPU builds: "1" (default) or "0": in_core_worker.py
MODEL_IN_CORE_ENV = "PDSPEC_MODEL_IN_CORE"  # "1" in an engine core that runs its model (in_core_worker.py)

KV_ONLY_ENV = "PDSPEC_KV_ONLY_DRAFTER"  # "1" (default) or "0": the start-up setting
KV_ONLY_FILE_ENV = "PDSPEC_KV_ONLY_DRAFTER_FILE"  # live switch ("on"/"off"), for tests and benchmarks

TEST_SKIP_DRAFTER_FILE_ENV = "PDSPEC_TEST_SKIP_DRAFTER_PREFILL_FILE"
TEST_DUMP_DRAFTER_KV_DIR_ENV = "PDSPEC_TEST_DUMP_DRAFTER_KV_DIR"  # decode worker, tests only
TEST_PAUSE_STEPS_FILE_ENV = "PDSPEC_TEST_PAUSE_STEPS_FILE"  # either role, tests only


class WatchedFile:
    """A small settings file, read again only when it changes (one stat per call)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime_ns: int | None = None

    def changed_text(self) -> str | None:
        """The file's text if it changed since the last call, else None (also when there
        is no file)."""
        if self.path is None:
            return None
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return None
        if mtime == self._mtime_ns:
            return None
        self._mtime_ns = mtime
        return self.path.read_text().strip()


class DraftsPolicySource:
    """The live drafts policy: the file named by PDSPEC_DRAFTS_FILE when it exists,
    else PDSPEC_DRAFTS."""

    def __init__(self, initial: DraftsPolicy, path: Path | None) -> None:
        self.policy: DraftsPolicy = initial
        self.file = WatchedFile(path)

    @classmethod
    def from_env(cls) -> DraftsPolicySource:
        initial = os.environ.get(DRAFTS_ENV, "auto")
        path = os.environ.get(DRAFTS_FILE_ENV)
        return cls(_parse_policy(initial, "auto"), Path(path) if path else None)

    def current(self) -> DraftsPolicy:
        text = self.file.changed_text()
        if text is not None:
            self.policy = _parse_policy(text, self.policy)
        return self.policy


def _parse_policy(text: str, fallback: DraftsPolicy) -> DraftsPolicy:
    if text in DRAFTS_POLICIES:
        return text  # type: ignore[return-value]
    log.warning("pdspec: ignoring unknown drafts policy %r; keeping %r", text, fallback)
    return fallback


def write_policy(path: Path, policy: DraftsPolicy) -> None:
    """Switch a running engine (atomic, so the engine never reads half a word)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(policy)
    os.replace(tmp, path)


class LiveFlag:
    """An on/off setting: the file named by `path` when it exists ("on"/"off"), else the
    start-up value."""

    def __init__(self, initial: bool, path: Path | None) -> None:
        self.value = initial
        self.file = WatchedFile(path)

    @classmethod
    def kv_only_from_env(cls) -> LiveFlag:
        path = os.environ.get(KV_ONLY_FILE_ENV)
        return cls(os.environ.get(KV_ONLY_ENV, "1") != "0", Path(path) if path else None)

    def current(self) -> bool:
        text = self.file.changed_text()
        if text in ("on", "off"):
            self.value = text == "on"
        elif text is not None:
            log.warning("pdspec: ignoring %r in %s (want on/off)", text, self.file.path)
        return self.value
