"""Prefill worker, API server: a prefill leg's reply never fails after its engine ran.

A prefill leg asks for one output token and keeps the prompt's KV for the decode worker
(`kv_transfer_params.do_remote_decode`). Once the engine has finished it, the KV is parked
for a read that only a reply carrying its `kv_transfer_params` can start: a reply that
fails after that point leaves the KV held for the whole lease (`kv_lease_s`), and the
proxy, which sees only a 4xx, has nothing to release it with. Requests that anyone can
send would then fill the prefill worker's KV.

vLLM's Messages API is such a point: a named or required tool choice makes it parse the
generated text as the tool's JSON arguments (`messages_full_converter`, `json.loads`), and
one token (`{`) is not JSON, so it answered 400 after the engine ran (issue 39). The
guard wraps that converter: when it raises `ValueError` on a reply that carries
`kv_transfer_params` (the engine parked KV), the reply is converted again without its
tool calls. The prefill leg's text is thrown away by the proxy; what it needs, the
`kv_transfer_params` and the usage, is kept. A reply without `kv_transfer_params` (a
request sent straight to this worker, not a prefill leg) fails as vLLM fails it.

Every rescue is counted (`pdspec_prefill_replies_rescued_total{api}`); the feature
reports itself (`prefill_reply_guard`: off when this vLLM has no such converter).
Installed in the API server's process by `pdspec.worker.serve`, before vLLM's server
starts: the engine's processes never serve replies.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from prometheus_client import Counter

from pdspec.worker.engine import features
from pdspec.worker.engine.wrap_once import wrap_once

log = logging.getLogger("pdspec.prefill.reply_guard")

MARKER = "prefill_reply_guard"
RESCUED = Counter(
    "pdspec_prefill_replies_rescued",
    "Prefill-leg replies that would have failed after the engine parked their KV, sent with their "
    "kv_transfer_params instead.",
    ["api"],
)


def parked_kv(reply: Any) -> bool:
    """Whether `reply` (vLLM's chat response behind a Messages reply) carries the
    `kv_transfer_params` of KV parked for a remote decode."""
    return isinstance(getattr(reply, "kv_transfer_params", None), dict)


def without_tool_calls(reply: Any) -> Any:
    """A copy of `reply` whose choices call no tool (their text is kept)."""
    copy = reply.model_copy(deep=True)
    for choice in copy.choices:
        choice.message.tool_calls = []
    return copy


def guard_messages_converter(original):
    @functools.wraps(original)
    def converter(self, generator, *args, **kwargs):
        try:
            return original(self, generator, *args, **kwargs)
        except ValueError as exc:  # json.JSONDecodeError among them
            if not parked_kv(generator):
                raise
            RESCUED.labels("messages").inc()
            log.info("prefill leg's Messages reply failed after its engine ran (%s); sent without tool calls", exc)
            return original(self, without_tool_calls(generator), *args, **kwargs)

    return converter


def install_reply_guard() -> bool:
    """Wraps vLLM's Messages converter; reports the feature. Returns whether it is on."""
    try:
        from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
    except ImportError as exc:
        features.report(features.PREFILL_REPLY_GUARD, False, f"vLLM's Messages serving did not import: {exc}")
        return False
    if not callable(getattr(AnthropicServingMessages, "messages_full_converter", None)):
        features.report(features.PREFILL_REPLY_GUARD, False, "this vLLM has no Messages messages_full_converter")
        return False
    wrap_once(AnthropicServingMessages, "messages_full_converter", MARKER, guard_messages_converter)
    features.report(features.PREFILL_REPLY_GUARD, True)
    return True
