import pytest

from proxy.errors import ProxyError
from proxy.validation import ChatCompletionRequest, CompletionRequest, parse_json_object, validate


def test_parses_a_json_object():
    assert parse_json_object(b'{"model": "m"}') == {"model": "m"}


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"{bad", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b"", "not valid JSON"),
    ],
)
def test_rejects_bodies_that_are_not_json_objects(raw, fragment):
    with pytest.raises(ProxyError) as info:
        parse_json_object(raw)
    assert info.value.status == 400
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "x"}, "model"),
        ({"model": "m"}, "prompt"),
        ({"model": 3, "prompt": "x"}, "model"),
        ({"model": "m", "prompt": "x", "max_tokens": "5"}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
        ({"model": "m", "prompt": "x", "n": 0}, "n"),
        ({"model": "m", "prompt": "x", "temperature": -1}, "temperature"),
        ({"model": "m", "prompt": [1, -2]}, "prompt"),
        ({"model": "m", "prompt": "x", "kv_transfer_params": {"remote_host": "10.0.0.1"}}, "kv_transfer_params"),
    ],
)
def test_completion_field_errors_name_the_field(body, param):
    with pytest.raises(ProxyError) as info:
        validate(body, CompletionRequest)
    assert info.value.status == 400
    assert info.value.param is not None and info.value.param.startswith(param)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
         "max_completion_tokens"),
    ],
)
def test_chat_field_errors_name_the_field(body, param):
    with pytest.raises(ProxyError) as info:
        validate(body, ChatCompletionRequest)
    assert info.value.param is not None and info.value.param.startswith(param)


def test_unknown_fields_pass_through():
    body = {"model": "m", "prompt": "x", "ignore_eos": True, "seed": 3}
    assert validate(body, CompletionRequest).model_extra == {"ignore_eos": True, "seed": 3}
