"""Chat's own request rules, and its entry: the generic legs with `max_completion_tokens`
capped too, OpenAI's usage."""

import pytest

from proxy.apis.chat import CHAT, ChatCompletionRequest
from proxy.apis.validation import validate
from proxy.errors import ProxyError


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages"),
        ({"model": "m", "messages": [{"role": 7, "content": "x"}]}, "messages"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
    ],
)
def test_chat_field_errors_name_the_field(body, param):
    with pytest.raises(ProxyError) as info:
        validate(body, ChatCompletionRequest)
    assert info.value.param is not None and info.value.param.startswith(param)


def test_the_prefill_leg_caps_max_completion_tokens_too():
    leg = CHAT.prefill_body({"model": "m", "messages": [], "max_completion_tokens": 9})
    assert leg["max_tokens"] == 1 and leg["max_completion_tokens"] == 1
