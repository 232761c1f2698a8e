"""Completions' own request rules, and its entry: the generic legs, OpenAI's usage."""

import pytest

from proxy.apis.completions import COMPLETIONS, CompletionRequest
from proxy.apis.validation import validate
from proxy.errors import ProxyError


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m"}, "prompt"),
        ({"model": 3, "prompt": "x"}, "model"),
        ({"model": "m", "prompt": "x", "max_tokens": "five"}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": 2.5}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"model": "m", "prompt": "x", "stream": "maybe"}, "stream"),
        ({"model": "m", "prompt": "x", "n": 0}, "n"),
        ({"model": "m", "prompt": [1, -2]}, "prompt"),
        ({"model": "m", "prompt": "x", "kv_transfer_params": {"remote_host": "10.0.0.1"}}, "kv_transfer_params"),
    ],
)
def test_completion_field_errors_name_the_field(body, param):
    with pytest.raises(ProxyError) as info:
        validate(body, CompletionRequest)
    assert info.value.status == 400
    assert info.value.param is not None and info.value.param.startswith(param)


def test_the_prefill_leg_caps_max_tokens_only():
    leg = COMPLETIONS.prefill_body({"model": "m", "prompt": "x", "max_tokens": 9})
    assert leg["max_tokens"] == 1 and "max_completion_tokens" not in leg
    assert COMPLETIONS.fans_out and not COMPLETIONS.chat
