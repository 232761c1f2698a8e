"""`/v1/messages` against vLLM's `AnthropicMessagesRequest` (with its conversion to chat),
over generated bodies, by the property of test_validation_differential.py: the proxy
refuses a body only if vLLM does, and refuses itself what vLLM would refuse only on the
decode leg."""

from __future__ import annotations

import copy

from hypothesis import given

from proxy.apis.messages import prefill_body as messages_prefill_body
from proxy.apis.messages import validate_messages
from proxy.errors import ProxyError
from tests.request_bodies import MESSAGES_FIELDS, UNIT_SETTINGS, bodies


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


@UNIT_SETTINGS
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
