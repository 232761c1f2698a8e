"""A decode worker's Responses event stream on its way to the client (proxy/apis/named_events.py
relays it event by event).

vLLM frames each event as `event: <type>` and `data: <json>` lines and numbers them
(`sequence_number`); the stream has no `[DONE]`. Events pass through byte for byte,
except:
- an event carrying `response.usage` (`response.completed`) gets the prefill leg's
  `cached_tokens` (proxy/apis/usage.py, patch_responses_usage);
- when the decode stream breaks, the proxy's error event is the Responses API's `error`
  event (`type`, `code`, `message`, `param`, `sequence_number`, numbered after the last
  event relayed), which the openai client yields as a `ResponseErrorEvent`.

vLLM sends two events before its engine has even received the request
(`response.created`, `response.in_progress`): `PREAMBLE_EVENTS`. The decode worker has
read the prompt's KV only once a third event begins, which is what Relay waits for
before it counts the hand-off as done (proxy/flow/disagg.py).
"""

from __future__ import annotations

from http import HTTPStatus

from proxy.apis.named_events import NamedEventStream, event_bytes, parse_data, with_data
from proxy.apis.usage import RESPONSES_MARKER, patch_responses_usage

PREAMBLE_EVENTS = 2
_SEQUENCE = b'"sequence_number":'


class ResponsesStream(NamedEventStream):
    __slots__ = ("sequence",)

    def __init__(self, cached_tokens: int | None) -> None:
        super().__init__(cached_tokens)
        self.sequence = -1  # the last event's number

    def error_event(self, status: int, message: str) -> bytes:
        self._breaking()
        code = HTTPStatus(status).phrase.lower().replace(" ", "_")
        return event_bytes("error", {"type": "error", "code": code, "message": message, "param": None,
                                     "sequence_number": self.sequence + 1})  # fmt: skip

    def _event(self, event: bytes) -> bytes:
        at = event.rfind(_SEQUENCE)  # the event's own number is its last (nested objects come first)
        if at != -1:
            digits = event[at + len(_SEQUENCE) :].lstrip()[:20].split(b",")[0].split(b"}")[0]
            try:
                self.sequence = int(digits)
            except ValueError:
                pass
        if self.cached_tokens is None or RESPONSES_MARKER not in event:
            return event
        parsed = parse_data(event)
        if parsed is None:
            return event
        head, payload = parsed
        response = payload.get("response") if isinstance(payload, dict) else None
        if not isinstance(response, dict) or not patch_responses_usage(response.get("usage"), self.cached_tokens):
            return event
        return with_data(head, payload)
