"""Stop NIXL's progress thread from busy-spinning a core on an idle worker.

nixl's Python API hard-codes the agent's progress-thread delay (`pthrDelay`) to 0 us,
and vLLM keeps the progress thread on, so every idle worker burns a full core; on a
2-core machine two idle workers slowed decode about 5x. Turning the thread off makes
transfers hang, so instead the delay is raised (1000 us keeps a transfer of a few KB
at a few ms and an idle worker near 1% of a core). nixl builds its agent config inside
`nixl_agent.__init__`, so the only hook is the bindings module that `_api` calls:
we wrap its `nixlAgent` constructor to set the delay on the config it receives.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("pdspec.worker.nixl_progress")

PROGRESS_DELAY_ENV = "PDSPEC_NIXL_PROGRESS_DELAY_US"


class _BindingsWithProgressDelay:
    """Stands in for nixl's bindings module; only `nixlAgent` changes."""

    def __init__(self, bindings: Any, delay_us: int) -> None:
        self._bindings = bindings
        self.delay_us = delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 (nixl's name)
        config.pthrDelay = self.delay_us
        return self._bindings.nixlAgent(name, config)


def apply_progress_delay(delay_us: int) -> bool:
    """Patch nixl (if installed) so new agents poll every `delay_us`. Idempotent."""
    try:
        from nixl import _api
    except ImportError:
        return False
    current = _api.nixlBind
    if isinstance(current, _BindingsWithProgressDelay):
        current.delay_us = delay_us
        return True
    _api.nixlBind = _BindingsWithProgressDelay(current, delay_us)
    log.info("NIXL progress thread delay set to %d us", delay_us)
    return True
