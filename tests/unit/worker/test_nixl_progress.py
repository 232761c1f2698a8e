"""The NIXL busy-spin fix, on a real NIXL agent (no vLLM): an idle agent's progress
thread burns a core with nixl's default delay of 0 us and almost nothing with ours."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("nixl")

IDLE_AGENT = textwrap.dedent(
    """
    import sys, time
    from pdspec.worker.nixl_progress import apply_progress_delay
    delay = int(sys.argv[1])
    if delay >= 0:
        apply_progress_delay(delay)
    from nixl._api import nixl_agent, nixl_agent_config
    agent = nixl_agent("idle", nixl_agent_config(backends=["UCX"]))
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(2.0)  # the measurement window: the agent is idle meanwhile
    print((time.process_time() - cpu0) / (time.monotonic() - wall0))
    """
)


def idle_cores(delay_us: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", IDLE_AGENT, str(delay_us)], capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def test_default_nixl_agent_busy_spins_and_the_delay_stops_it():
    spinning = idle_cores(-1)  # nixl as shipped
    fixed = idle_cores(1000)
    assert spinning > 0.25, "nixl no longer busy-spins: the fix may be obsolete"
    assert fixed < 0.1
    assert fixed < spinning / 5


def test_patch_is_idempotent_and_updates_the_delay():
    from nixl import _api

    from pdspec.worker.nixl_progress import _BindingsWithProgressDelay, apply_progress_delay

    original = _api.nixlBind
    try:
        assert apply_progress_delay(500)
        assert apply_progress_delay(700)
        assert isinstance(_api.nixlBind, _BindingsWithProgressDelay)
        assert _api.nixlBind.delay_us == 700
        assert not isinstance(_api.nixlBind._bindings, _BindingsWithProgressDelay)
    finally:
        _api.nixlBind = original
