"""A decode worker's Anthropic Messages event stream on its way to the client
(proxy/apis/named_events.py relays it event by event).

vLLM frames each event as `event: <type>` and `data: <json>` lines; the stream ends with
`message_stop` (no `[DONE]`). Events pass through byte for byte, except that the usage in
`message_start` (`message.usage`) and `message_delta` (`usage`) gets the prefill leg's
cache counts (`cached_tokens` holds proxy/apis/usage.py's MessagesCache; patch_messages_usage), and that a broken
decode stream ends with Anthropic's `error` event (`{"type": "error", "error": {"type":
"api_error", "message": ...}}`), which the anthropic client raises as an error.
"""

from __future__ import annotations

from proxy.apis.named_events import NamedEventStream, event_bytes, parse_data, with_data
from proxy.apis.usage import CREATION_MARKER, MESSAGES_MARKER, patch_messages_usage


class MessagesStream(NamedEventStream):
    __slots__ = ()

    def error_event(self, status: int, message: str) -> bytes:
        self._breaking()
        return event_bytes("error", {"type": "error", "error": {"type": "api_error", "message": message}})

    def _event(self, event: bytes) -> bytes:
        if self.cached_tokens is None or (MESSAGES_MARKER not in event and CREATION_MARKER not in event):
            return event
        parsed = parse_data(event)
        if parsed is None or not isinstance(parsed[1], dict):
            return event
        head, payload = parsed
        message = payload.get("message")
        usage = message.get("usage") if isinstance(message, dict) else payload.get("usage")
        if not patch_messages_usage(usage, self.cached_tokens):
            return event
        return with_data(head, payload)
