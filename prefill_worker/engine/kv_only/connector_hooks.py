"""Whether a KV connector's layer-by-layer hooks do anything.

vLLM's attention layers call the KV connector around each layer (`wait_for_layer_load`
before, `save_kv_layer` after). The KV-only drafter pass writes the drafter's cache
without running attention, so those calls do not happen for the drafter layer: safe
only when the connector's hooks do nothing. The check used to compare the connector's
class name with "NixlConnector", but vLLM registers that name for `NixlPullConnector`
(`NixlConnector = NixlPullConnector` in 0.32), so every P/D prefill worker ran with the
pass off. This looks at what the hooks are instead: functions whose body is empty (a
docstring, `pass`, `return None`), whatever the class is called; a connector that wraps
others (MultiConnector) or saves layer by layer has hooks with a body and keeps the
full pass.
"""

from __future__ import annotations

import dis
from typing import Any

LAYER_HOOKS = ("wait_for_layer_load", "save_kv_layer")
_EMPTY_OPS = {"RESUME", "NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST", "CACHE"}


def does_nothing(function: Any) -> bool:
    """Whether `function`'s body only returns None."""
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    for instruction in dis.get_instructions(code):
        if instruction.opname not in _EMPTY_OPS:
            return False
        if instruction.opname in ("LOAD_CONST", "RETURN_CONST") and instruction.argval is not None:
            return False
    return True


def busy_layer_hooks(connector: Any) -> list[str]:
    """The connector's layer hooks that do work, as `Class.method` (empty: none do)."""
    busy = []
    for name in LAYER_HOOKS:
        hook = getattr(type(connector), name, None)
        if hook is not None and not does_nothing(hook):
            busy.append(f"{type(connector).__name__}.{name}")
    return busy


def kv_only_connector_reason() -> str | None:
    """Why this process's KV connector rules out the KV-only pass (None: it allows it)."""
    try:
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
    except ImportError:
        return "vLLM's KV transfer API not found"
    if not has_kv_transfer_group():
        return None
    busy = busy_layer_hooks(get_kv_transfer_group())
    if busy:
        return f"the KV connector works layer by layer ({', '.join(busy)})"
    return None
