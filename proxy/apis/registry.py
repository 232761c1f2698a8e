"""The APIs the proxy serves through P/D, one entry each (its module builds it): the app
mounts an endpoint per entry at its path (proxy/app.py)."""

from __future__ import annotations

from proxy.apis.chat import CHAT
from proxy.apis.completions import COMPLETIONS
from proxy.apis.messages import MESSAGES
from proxy.apis.responses import RESPONSES

APIS = (COMPLETIONS, CHAT, RESPONSES, MESSAGES)
