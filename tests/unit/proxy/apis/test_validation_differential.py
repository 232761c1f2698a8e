"""The proxy's acceptance rules against vLLM's own request classes, over generated bodies.

For a body B and its prefill leg P (what proxy/apis/legs.py sends the prefill worker):
- the proxy refuses B only if vLLM refuses B: it is never stricter than vLLM;
- if vLLM refuses B but accepts P, the proxy must refuse B itself: otherwise the prefill
  worker would compute the prompt and pin its KV for a decode leg that vLLM refuses;
- if vLLM refuses P, the prefill worker refuses it before pinning anything, so the
  proxy may leave it to the worker; so it may when B is served decode-only (no P at all).
A refusal is always a 400 with a named parameter (OpenAI's error shape is built from it in
proxy/asgi.py). The same property runs through the real stack in
tests/e2e/test_validation_differential.py, where "vLLM" is a real worker.

Here completions and chat; `/v1/responses` and `/v1/messages` are checked the same way in
test_responses_differential.py and test_messages_differential.py.
"""

from __future__ import annotations

import copy

from hypothesis import given

from proxy.apis.chat import ChatCompletionRequest
from proxy.apis.completions import CompletionRequest
from proxy.apis.legs import decode_only_reason, prefill_body
from proxy.apis.validation import validate
from proxy.edge.endpoint import check_choices
from proxy.errors import ProxyError
from tests.request_bodies import CHAT_FIELDS, COMPLETION_FIELDS, MAX_CHOICES, UNIT_SETTINGS, beyond_max_choices, bodies


def vllm_refuses(body: dict, chat: bool) -> bool:
    """vLLM 0.32's verdict: its request model, then its SamplingParams (what its serving
    layer builds from the request, with the request's own max_tokens, else vLLM's 16 for
    completions, and for chat what is left of the context: unbounded here, since only
    the workers know the prompt's length; proxy/apis/limits.py refuses a `min_tokens` beyond the
    whole context, and a release leg frees the KV of what the decode worker still refuses)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion

    try:
        request = (VllmChat if chat else VllmCompletion).model_validate(copy.deepcopy(body))
        max_tokens = request.max_tokens
        if chat and request.max_completion_tokens is not None:  # as vLLM's chat serving picks it
            max_tokens = request.max_completion_tokens
        if max_tokens is None:  # chat: the context left, which the proxy bounds in proxy/apis/limits.py
            max_tokens = 2**63 if chat else 16
        if request.use_beam_search:
            request.to_beam_search_params(max_tokens, {})
        else:
            request.to_sampling_params(max_tokens, {})
    except Exception:  # pydantic's ValidationError, VLLMValidationError and ValueError alike
        return True
    return False


def proxy_refusal(body: dict, chat: bool) -> ProxyError | None:
    """What proxy/edge/endpoint.py checks before any leg: validation, then the bound on choices."""
    try:
        body = copy.deepcopy(body)
        validate(body, ChatCompletionRequest if chat else CompletionRequest)
        check_choices(body, MAX_CHOICES)
    except ProxyError as exc:
        return exc
    return None


def served_decode_only(body: dict, chat: bool) -> bool:
    """No prefill leg at all (proxy/apis/legs.py): the decode worker checks the whole request."""
    body = copy.deepcopy(body)
    validate(body, ChatCompletionRequest if chat else CompletionRequest)
    return decode_only_reason(body) is not None


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


@UNIT_SETTINGS
@given(bodies(COMPLETION_FIELDS, "prompt"))
def test_completions_agree_with_vllm(body):
    check(body, chat=False)


@UNIT_SETTINGS
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
