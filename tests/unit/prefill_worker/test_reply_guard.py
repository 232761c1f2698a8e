"""prefill_worker/reply_guard.py on vLLM's own Messages converter and response classes: a
prefill leg's one-token tool call (`{`) is sent with its kv_transfer_params instead of
failing after the engine parked the KV; a reply without them fails as vLLM fails it."""

from __future__ import annotations

import json

import pytest

from pdspec.worker.engine import features
from prefill_worker import reply_guard

pytest.importorskip("vllm")
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse  # noqa: E402

PARKED = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_engine_id": "e", "remote_request_id": "r"}


def chat_reply(arguments: str, kv_transfer_params: dict | None) -> ChatCompletionResponse:
    return ChatCompletionResponse.model_validate(
        {
            "id": "chatcmpl-1",
            "created": 0,
            "model": "m",
            "kv_transfer_params": kv_transfer_params,
            "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41},
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length",
                    "message": {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": arguments},
                            }
                        ],
                    },
                }
            ],
        }
    )


@pytest.fixture(scope="module", autouse=True)
def guarded():
    assert reply_guard.install_reply_guard()
    assert features.reported()[features.PREFILL_REPLY_GUARD] == ("on", "")


def convert(reply: ChatCompletionResponse):
    return AnthropicServingMessages.messages_full_converter(None, reply)


def test_a_parked_prefills_one_token_tool_call_is_sent_with_its_kv_params():
    before = reply_guard.RESCUED.labels("messages")._value.get()
    converted = convert(chat_reply("{", PARKED))
    assert converted.kv_transfer_params == PARKED
    assert [block.type for block in converted.content] == ["text"]
    assert converted.usage.input_tokens == 40
    assert reply_guard.RESCUED.labels("messages")._value.get() == before + 1


def test_a_reply_without_parked_kv_fails_as_vllm_fails_it():
    with pytest.raises(json.JSONDecodeError):
        convert(chat_reply("{", None))


def test_a_whole_tool_call_is_untouched():
    converted = convert(chat_reply('{"city": "Paris"}', PARKED))
    assert [(block.type, block.input) for block in converted.content] == [("tool_use", {"city": "Paris"})]


def test_installing_twice_wraps_once():
    first = AnthropicServingMessages.messages_full_converter
    reply_guard.install_reply_guard()
    assert AnthropicServingMessages.messages_full_converter is first
