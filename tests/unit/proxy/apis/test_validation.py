"""The validation completions and chat share (the body read as JSON, the shared rules
run around each API's own), checked on both request models."""

import pytest

from proxy.apis.chat import ChatCompletionRequest
from proxy.apis.completions import CompletionRequest
from proxy.apis.validation import parse_json_object, validate
from proxy.errors import ProxyError


def test_parses_a_json_object():
    assert parse_json_object(b'{"model": "m"}') == {"model": "m"}


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"{bad", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b'{"model": "\xff"}', "not valid UTF-8"),
        (b"\xff\xfe{}", "not valid JSON"),  # a UTF-16 byte order mark, then no JSON
        (b"", "not valid JSON"),
    ],
)
def test_rejects_bodies_that_are_not_json_objects(raw, fragment):
    with pytest.raises(ProxyError) as info:
        parse_json_object(raw)
    assert info.value.status == 400
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "body, schema, coerced",
    [
        # vLLM's request models are lax: these are what vLLM reads, so what the proxy
        # forwards and routes by (issue 24, item 10).
        ({"model": "m", "prompt": "x", "max_tokens": 4.0}, CompletionRequest, {"max_tokens": 4}),
        ({"model": "m", "prompt": "x", "max_tokens": "5"}, CompletionRequest, {"max_tokens": 5}),
        ({"model": "m", "prompt": "x", "logprobs": True}, CompletionRequest, {"logprobs": 1}),
        ({"model": "m", "prompt": "x", "stream": "yes"}, CompletionRequest, {"stream": True}),
        ({"model": "m", "prompt": "x", "n": "2", "temperature": 1}, CompletionRequest, {"n": 2}),
        ({"prompt": "x"}, CompletionRequest, {}),
        ({"model": "m", "messages": [{"role": "function", "name": "f", "content": "1"}]}, ChatCompletionRequest, {}),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, ChatCompletionRequest, {}),
        # Left to the prefill worker, which carries them and refuses before pinning KV.
        ({"model": "m", "prompt": "x", "temperature": -1}, CompletionRequest, {}),
        ({"model": "m", "messages": []}, ChatCompletionRequest, {}),
    ],
)
def test_what_vllm_coerces_is_accepted_and_coerced(body, schema, coerced):
    body = dict(body)
    validate(body, schema)
    assert {key: body[key] for key in coerced} == coerced
    assert all(type(body[key]) is type(value) for key, value in coerced.items())


def test_unknown_fields_pass_through():
    body = {"model": "m", "prompt": "x", "ignore_eos": True, "top_k": 3}
    assert validate(body, CompletionRequest).model_extra == {"ignore_eos": True, "top_k": 3}


C = {"model": "m", "prompt": "x"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


DECODE_ONLY_REFUSALS = [
    # The example: the prefill leg drops stream_options, the decode worker refuses it.
    ({**C, "stream_options": {"include_usage": True}}, CompletionRequest, "stream_options"),
    ({**C, "stream": False, "stream_options": {"include_usage": True}}, CompletionRequest, "stream_options"),
    ({**CHAT, "stream_options": {"include_usage": False}}, ChatCompletionRequest, "stream_options"),
    ({**C, "seed": 2**63}, CompletionRequest, "seed"),
    ({**CHAT, "seed": 1.5}, ChatCompletionRequest, "seed"),
    ({**C, "min_tokens": -1}, CompletionRequest, "min_tokens"),
    ({**C, "min_tokens": None}, CompletionRequest, "min_tokens"),
    ({**C, "max_tokens": 4, "min_tokens": 5}, CompletionRequest, "min_tokens"),
    ({**CHAT, "max_completion_tokens": 4, "min_tokens": 5}, ChatCompletionRequest, "min_tokens"),
    ({**C, "prompt_logprobs": "1"}, CompletionRequest, "prompt_logprobs"),
    ({**C, "prompt_logprobs": -2}, CompletionRequest, "prompt_logprobs"),
    ({**C, "stream": True, "prompt_logprobs": 1}, CompletionRequest, "prompt_logprobs"),
    ({**CHAT, "stream": True, "prompt_logprobs": -1}, ChatCompletionRequest, "prompt_logprobs"),
    ({**CHAT, "echo": None}, ChatCompletionRequest, "echo"),
    ({**CHAT, "top_logprobs": 3}, ChatCompletionRequest, "top_logprobs"),
    ({**CHAT, "logprobs": False, "top_logprobs": 3}, ChatCompletionRequest, "top_logprobs"),
    ({**C, "use_beam_search": True, "echo": True, "logprobs": 1}, CompletionRequest, "echo"),
    ({**C, "n": None}, CompletionRequest, "n"),
]

ACCEPTED_BY_VLLM = [
    (
        {**C, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        CompletionRequest,
    ),
    ({**C, "stream_options": {}}, CompletionRequest),  # empty: vLLM lets it pass too
    ({**C, "stream_options": None}, CompletionRequest),
    ({**C, "seed": -(2**63), "min_tokens": 3, "max_tokens": 3}, CompletionRequest),
    ({**C, "prompt_logprobs": -1}, CompletionRequest),
    ({**C, "prompt_logprobs": 0, "stream": True}, CompletionRequest),
    ({**C, "use_beam_search": True, "echo": True}, CompletionRequest),
    ({**CHAT, "logprobs": True, "top_logprobs": 3, "echo": True}, ChatCompletionRequest),
    ({**CHAT, "top_logprobs": 0, "n": None, "max_tokens": 2, "min_tokens": 2}, ChatCompletionRequest),
]


@pytest.mark.parametrize("body, schema, param", DECODE_ONLY_REFUSALS)
def test_what_only_the_decode_leg_would_refuse_is_refused_up_front(body, schema, param):
    """The prefill leg does not carry these fields (proxy/apis/legs.py), so a request that
    vLLM refuses for them would pass the prefill leg and pin its KV."""
    with pytest.raises(ProxyError) as info:
        validate(body, schema)
    assert info.value.status == 400
    assert info.value.param is not None and info.value.param.startswith(param)


@pytest.mark.parametrize("body, schema", ACCEPTED_BY_VLLM)
def test_what_vllm_accepts_still_passes(body, schema):
    validate(body, schema)


def vllm_refuses(body: dict, schema) -> bool:
    """vLLM 0.32's own verdict: its request model, then the SamplingParams rules the
    proxy copies (min_tokens against an explicit max_tokens)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion
    from vllm.sampling_params import SamplingParams

    model = VllmChat if schema is ChatCompletionRequest else VllmCompletion
    try:
        request = model.model_validate(body)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        SamplingParams(max_tokens=max_tokens, min_tokens=request.min_tokens, seed=request.seed)
    except Exception:  # vLLM raises pydantic, VLLMValidationError and ValueError alike
        return True
    return False


def test_the_cases_agree_with_vllm_itself():
    """The two lists above are vLLM's verdicts, checked against vLLM's own classes."""
    assert [vllm_refuses(body, schema) for body, schema, _ in DECODE_ONLY_REFUSALS] == [True] * len(
        DECODE_ONLY_REFUSALS
    )
    assert [vllm_refuses(body, schema) for body, schema in ACCEPTED_BY_VLLM] == [False] * len(ACCEPTED_BY_VLLM)
