"""When `pdspec up` starts a child (worker or proxy) again after it exited.

Pure bookkeeping, no processes: `RestartPolicy.after_exit(child, now)` answers the pause
before the restart, or None when the child has crashed more than `max_restarts` times
within `window_s` (the stack then stops, naming the child), or when restarts are off
(`restart = "never"`: fail fast, the stack stops at the first exit). The pause doubles
with each exit still inside the window, from `backoff_s` up to `MAX_BACKOFF_S`. The
proxy's own processes (`proxy.workers` > 1, proxy/processes.py) are restarted by the same
rule, each slot a child.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

MAX_BACKOFF_S = 60.0


@dataclass
class RestartPolicy:
    enabled: bool = True
    max_restarts: int = 5
    window_s: float = 600.0
    backoff_s: float = 1.0
    _exits: dict[str, deque] = field(default_factory=lambda: defaultdict(deque), repr=False)

    def after_exit(self, child: str, now: float) -> float | None:
        if not self.enabled:
            return None
        exits = self._exits[child]
        exits.append(now)
        while exits and now - exits[0] > self.window_s:
            exits.popleft()
        if len(exits) > self.max_restarts:
            return None
        return min(self.backoff_s * 2 ** (len(exits) - 1), MAX_BACKOFF_S)

    def exits_in_window(self, child: str) -> int:
        return len(self._exits[child])
