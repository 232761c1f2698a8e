"""Waiting in async tests for a condition that other tasks make true."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], object], timeout_s: float = 5.0, interval_s: float = 0.01) -> None:
    """Return once `condition()` is true; fail the test (AssertionError) after `timeout_s`.
    Polls every `interval_s`: the condition is plain state, with no event to wait on."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(interval_s)
