"""`pdspec up` stops cleanly: after SIGTERM no process it started is left."""

import psutil
import pytest


@pytest.mark.stops_stack
def test_sigterm_leaves_no_process_behind(stack):
    started = stack.descendants()
    assert len(started) >= 5  # proxy, two API servers, their engine cores (and workers)
    assert stack.stop(timeout_s=90) == 0
    gone, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, [p.info if hasattr(p, "info") else p for p in alive]
    assert "pdspec up: stopped" in "\n".join(stack.output + [stack.process.stdout.read()])
