"""The proxy's acceptance rules against vLLM's own request classes, over generated bodies.

For a body B and its prefill leg P (what proxy/legs.py sends the prefill worker):
- the proxy refuses B only if vLLM refuses B: it is never stricter than vLLM;
- if vLLM refuses B but accepts P, the proxy must refuse B itself: otherwise the prefill
  worker would compute the prompt and pin its KV for a decode leg that vLLM refuses;
- if vLLM refuses P, the prefill worker refuses it before pinning anything, so the
  proxy may leave it to the worker; so it may when B is served decode-only (no P at all).
A refusal is always a 400 with a named parameter (OpenAI's error shape is built from it in
proxy/asgi.py). The same property runs through the real stack in
tests/e2e/test_validation_differential.py, where "vLLM" is a real worker.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdspec.settings import ProxySettings
from proxy.app import check_choices
from proxy.errors import ProxyError
from proxy.fanout import choice_count
from proxy.legs import decode_only_reason, prefill_body
from proxy.validation import ChatCompletionRequest, CompletionRequest, validate

# Values that probe pydantic's lax mode (numbers as strings, floats with and without a
# fraction, bools as numbers and words), ranges, nulls and wrong types.
INTS = st.sampled_from([None, 0, 1, 2, 3, -1, -2, 4.0, 2.5, "3", "x", True, False, 2**63 - 1, 2**63, -(2**63), [], {}])
FLOATS = st.sampled_from([None, 0, 0.0, 0.5, 1, 1.0, 2.5, -1, "0.7", "hot", True, [], 1e-6])
BOOLS = st.sampled_from([None, True, False, 0, 1, 2, "true", "false", "yes", "no", "maybe", [], 0.0])
STREAM_OPTIONS = st.sampled_from(
    [None, {}, {"include_usage": True}, {"include_usage": "yes"}, {"continuous_usage_stats": True}, "all", 5]
)
PROMPTS = st.sampled_from(
    [None, "", "The capital of France is", ["a", "b"], [1, 2, 3], [[1, 2], [3]], [1, -2], [1, "a"], 5, {"a": 1}, []]
)
MESSAGES = st.sampled_from(
    [
        [{"role": "user", "content": "hi"}],
        [{"role": "function", "name": "f", "content": "1"}, {"role": "user", "content": "hi"}],
        [{"role": "wizard", "content": "x"}],
        [{"role": 7, "content": "x"}],
        [{"content": "x"}],
        ["hi"],
        [],
        "hello",
    ]
)
COMMON = {
    "model": st.sampled_from(["m", "", None, 7]),
    "stream": BOOLS,
    "stream_options": STREAM_OPTIONS,
    "max_tokens": INTS,
    "n": INTS,
    "temperature": FLOATS,
    "top_p": FLOATS,
    "seed": INTS,
    "min_tokens": INTS,
    "prompt_logprobs": INTS,
    "use_beam_search": BOOLS,
}
COMPLETION_FIELDS = {**COMMON, "prompt": PROMPTS, "logprobs": INTS, "echo": BOOLS}
CHAT_FIELDS = {
    **COMMON, "messages": MESSAGES, "logprobs": BOOLS, "top_logprobs": INTS, "max_completion_tokens": INTS,
    "echo": BOOLS,
}  # fmt: skip


MAX_CHOICES = ProxySettings().max_choices


def bodies(fields: dict, required: str):
    """A body with `required` always present and any subset of the other fields."""
    optional = {name: strategy for name, strategy in fields.items() if name != required}
    return st.fixed_dictionaries({required: fields[required]}, optional=optional)


def vllm_refuses(body: dict, chat: bool) -> bool:
    """vLLM 0.32's verdict: its request model, then its SamplingParams (what its serving
    layer builds from the request, with the request's own max_tokens, else vLLM's 16 for
    completions, and for chat what is left of the context: unbounded here, since only
    the workers know the prompt's length; proxy/limits.py refuses a `min_tokens` beyond the
    whole context, and a release leg frees the KV of what the decode worker still refuses)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion

    try:
        request = (VllmChat if chat else VllmCompletion).model_validate(copy.deepcopy(body))
        max_tokens = request.max_tokens
        if chat and request.max_completion_tokens is not None:  # as vLLM's chat serving picks it
            max_tokens = request.max_completion_tokens
        if max_tokens is None:  # chat: the context left, which the proxy bounds in proxy/limits.py
            max_tokens = 2**63 if chat else 16
        if request.use_beam_search:
            request.to_beam_search_params(max_tokens, {})
        else:
            request.to_sampling_params(max_tokens, {})
    except Exception:  # pydantic's ValidationError, VLLMValidationError and ValueError alike
        return True
    return False


def proxy_refusal(body: dict, chat: bool) -> ProxyError | None:
    """What proxy/app.py checks before any leg: validation, then the bound on choices."""
    try:
        body = copy.deepcopy(body)
        validate(body, ChatCompletionRequest if chat else CompletionRequest)
        check_choices(body, MAX_CHOICES)
    except ProxyError as exc:
        return exc
    return None


def served_decode_only(body: dict, chat: bool) -> bool:
    """No prefill leg at all (proxy/legs.py): the decode worker checks the whole request."""
    body = copy.deepcopy(body)
    validate(body, ChatCompletionRequest if chat else CompletionRequest)
    return decode_only_reason(body) is not None


def beyond_max_choices(body: dict) -> bool:
    """The one deliberate limit vLLM does not have: each choice is a prefill and a decode."""
    try:
        return choice_count(body) > MAX_CHOICES
    except TypeError:
        return False


def check(body: dict, chat: bool) -> None:
    refusal = proxy_refusal(body, chat)
    vllm_refuses_body = vllm_refuses(body, chat)
    if refusal is not None:
        assert refusal.status == 400 and refusal.message, refusal
        assert vllm_refuses_body or beyond_max_choices(body), f"the proxy refuses what vLLM accepts: {refusal.message}"
        return
    if vllm_refuses_body and not served_decode_only(body, chat):
        leg = prefill_body(body, chat)
        leg.pop("kv_transfer_params")
        assert vllm_refuses(leg, chat), "vLLM refuses the decode leg only: the prefill would pin KV for nothing"


SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(bodies(COMPLETION_FIELDS, "prompt"))
def test_completions_agree_with_vllm(body):
    check(body, chat=False)


@SETTINGS
@given(bodies(CHAT_FIELDS, "messages"))
def test_chat_agrees_with_vllm(body):
    check(body, chat=True)


def test_the_property_can_fail():
    """A proxy stricter than vLLM, or one that lets a decode-only refusal through, is caught."""
    accepted_by_vllm = {"model": "m", "prompt": "x", "max_tokens": 4.0}
    assert not vllm_refuses(accepted_by_vllm, chat=False)
    decode_only_refusal = {"model": "m", "prompt": "x", "min_tokens": -1}
    assert vllm_refuses(decode_only_refusal, chat=False)
    leg = prefill_body(decode_only_refusal, False)
    leg.pop("kv_transfer_params")
    assert not vllm_refuses(leg, chat=False)
    assert proxy_refusal(decode_only_refusal, chat=False) is not None
