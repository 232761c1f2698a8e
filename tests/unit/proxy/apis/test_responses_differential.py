"""`/v1/responses` against vLLM's `ResponsesRequest` (with its serving layer's checks), over
generated bodies, by the property of test_validation_differential.py: the proxy refuses a
body only if vLLM does, and refuses itself what vLLM would refuse only on the decode leg.
The stateful options are the one deliberate difference (proxy/apis/responses.py says why).
"""

from __future__ import annotations

import copy

from hypothesis import given

from proxy.apis.responses import decode_only_reason as responses_decode_only_reason
from proxy.apis.responses import prefill_body as responses_prefill_body
from proxy.apis.responses import validate_responses
from proxy.errors import ProxyError
from tests.request_bodies import RESPONSES_FIELDS, UNIT_SETTINGS, bodies


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


@UNIT_SETTINGS
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
