"""The one way pdspec patches vLLM: wrap an attribute of a class (or an object) once.

vLLM loads general plugins in every process it starts, and one process may install the
hooks more than once (an in-process benchmark builds several engines), so every patch
must be idempotent. Each patch names its own marker:
- the same marker never wraps twice;
- wrappers with different markers stack on one attribute (the KV-only pass and the
  test hook may both sit on a drafter's `propose`).
The markers travel on the wrapper in one attribute, and a wrapper made with
`functools.wraps` inherits its original's, so an outer wrapper never hides an inner one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MARKERS_ATTR = "_pdspec_wraps"


def markers(fn: Any) -> frozenset[str]:
    """The pdspec markers `fn` carries (empty for vLLM's own functions)."""
    return frozenset(getattr(fn, MARKERS_ATTR, ()))


def is_wrapped(fn: Any, marker: str) -> bool:
    return marker in markers(fn)


def wrap_once(
    owner: Any, name: str, marker: str, wrap: Callable[[Callable], Callable], *, static: bool = False
) -> bool:
    """Replace `owner.name` with `wrap(original)` unless it already carries `marker`.

    `static` stores the wrapper as a staticmethod (for a class's static function).
    Returns whether it wrapped; an owner without the attribute is left alone (another
    vLLM build: the caller reports the feature off)."""
    original = getattr(owner, name, None)
    if original is None or is_wrapped(original, marker):
        return False
    wrapper = wrap(original)
    setattr(wrapper, MARKERS_ATTR, markers(original) | {marker})
    setattr(owner, name, staticmethod(wrapper) if static else wrapper)
    return True
