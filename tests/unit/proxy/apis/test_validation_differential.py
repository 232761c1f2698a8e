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

`/v1/responses` and `/v1/messages` are checked the same way against vLLM's
`ResponsesRequest` and `AnthropicMessagesRequest` (with their serving layers' checks); the
Responses API's stateful options are the one deliberate difference there.
"""

from __future__ import annotations

import copy
import os

from hypothesis import HealthCheck, given, settings

from proxy.apis.legs import decode_only_reason, prefill_body
from proxy.apis.messages import prefill_body as messages_prefill_body
from proxy.apis.responses import decode_only_reason as responses_decode_only_reason
from proxy.apis.responses import prefill_body as responses_prefill_body
from proxy.apis.validation import ChatCompletionRequest, CompletionRequest, validate
from proxy.apis.validation_messages import validate_messages
from proxy.apis.validation_responses import validate_responses
from proxy.app import check_choices
from proxy.errors import ProxyError
from tests.request_bodies import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    MAX_CHOICES,
    MESSAGES_FIELDS,
    RESPONSES_FIELDS,
    beyond_max_choices,
    bodies,
)  # fmt: skip


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
    """What proxy/app.py checks before any leg: validation, then the bound on choices."""
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


# Derandomized, so CI runs the same bodies every time; PDSPEC_DIFF_RANDOM=1 (and more
# PDSPEC_DIFF_EXAMPLES) explores new ones.
SETTINGS = settings(
    max_examples=int(os.environ.get("PDSPEC_DIFF_EXAMPLES", "1500")),
    derandomize=not os.environ.get("PDSPEC_DIFF_RANDOM"),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


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


# --- the Responses API ----------------------------------------------------------------------


def vllm_refuses_responses(body: dict) -> bool:
    """vLLM 0.32's verdict on a /v1/responses body: its request model, its serving checks
    with the response store off (vLLM's default: a `previous_response_id` is not found, and
    background mode is refused), then SamplingParams with `max_output_tokens` capped at
    what a large context leaves, as its serving layer caps it."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest as VllmResponses

    try:
        request = VllmResponses.model_validate(copy.deepcopy(body))
        if request.previous_response_id is not None or (request.store and request.background):
            return True
        context = 2**20
        max_tokens = context if request.max_output_tokens is None else min(context, request.max_output_tokens)
        request.to_sampling_params(max_tokens, {})
    except Exception:
        return True
    return False


def check_responses(body: dict) -> None:
    try:
        validated = copy.deepcopy(body)
        validate_responses(validated)
        refusal = None
    except ProxyError as exc:
        refusal = exc
    vllm_refuses_body = vllm_refuses_responses(body)
    if refusal is not None:
        assert refusal.status == 400 and refusal.message and refusal.param, refusal
        # The deliberate limit: state across two workers (vLLM itself runs background mode
        # when `store` is a string it reads as false, and its response lives on one worker).
        stateful = "through this P/D proxy" in refusal.message
        assert vllm_refuses_body or stateful, f"the proxy refuses what vLLM accepts: {refusal.message}"
        return
    if vllm_refuses_body and responses_decode_only_reason(validated) is None:
        leg = responses_prefill_body(body)
        leg.pop("kv_transfer_params")
        assert vllm_refuses_responses(leg), "vLLM refuses the decode leg only: the prefill would pin KV for nothing"


@SETTINGS
@given(bodies(RESPONSES_FIELDS, "input"))
def test_responses_agree_with_vllm(body):
    check_responses(body)


def test_the_responses_property_can_fail():
    decode_only_refusal = {"model": "m", "input": "x", "max_output_tokens": 0}
    assert vllm_refuses_responses(decode_only_refusal)
    leg = responses_prefill_body(decode_only_refusal)
    leg.pop("kv_transfer_params")
    assert not vllm_refuses_responses(leg)
    assert not vllm_refuses_responses({"model": "m", "input": "x", "max_output_tokens": "4", "n": 0})


# --- Anthropic's Messages ---------------------------------------------------------------------


def vllm_refuses_messages(body: dict) -> bool:
    """vLLM 0.32's verdict on a /v1/messages body: its request model (whose thinking-budget
    check skips a prefill leg), its conversion to a chat request, then SamplingParams with
    that request's max_tokens."""
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    try:
        request = AnthropicMessagesRequest.model_validate(copy.deepcopy(body))
        chat = AnthropicServingMessages.to_chat_completion_request(request)
        chat.to_sampling_params(chat.max_completion_tokens, {})
    except Exception:
        return True
    return False


@SETTINGS
@given(bodies(MESSAGES_FIELDS, "messages"))
def test_messages_agree_with_vllm(body):
    try:
        validate_messages(copy.deepcopy(body))
        refusal = None
    except ProxyError as exc:
        refusal = exc
    refused_by_vllm = vllm_refuses_messages(body)
    if refusal is not None:
        assert refusal.status == 400 and refusal.message and refusal.param, refusal
        assert refused_by_vllm, f"the proxy refuses what vLLM accepts: {refusal.message}"
        return
    if refused_by_vllm:  # the prefill leg as sent: vLLM's model reads its kv_transfer_params
        assert vllm_refuses_messages(messages_prefill_body(body)), "vLLM refuses the decode leg only"


def test_the_messages_property_can_fail():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "16"}
    assert not vllm_refuses_messages(body)
    decode_only_refusal = {**body, "max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 4096}}
    assert vllm_refuses_messages(decode_only_refusal)
    assert not vllm_refuses_messages(messages_prefill_body(decode_only_refusal))
