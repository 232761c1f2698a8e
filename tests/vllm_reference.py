"""vLLM's own prompt ids for a request body, without a server: the renderer the API server
builds for a model folder (`renderer_from_config`), given the body through vLLM's request
models (`CompletionRequest`, `ChatCompletionRequest`), so request options apply as they
do when serving. The reference for the proxy's own tokenizer (proxy/routing/local_tokenizer.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Reference:
    renderer: Any
    model_config: Any


def reference(folder: Path, max_model_len: int = 4096) -> Reference:
    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers.registry import renderer_from_config

    model_config = ModelConfig(model=str(folder), max_model_len=max_model_len)
    return Reference(renderer_from_config(VllmConfig(model_config=model_config)), model_config)


def engine_ids(ref: Reference, body: dict, chat: bool) -> list[int]:
    """The prompt ids vLLM's serving path gives `body` (a completions or chat request)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    body = {"model": "m", **body}
    if chat:
        request = ChatCompletionRequest(**body)
        _, prompts = ref.renderer.render_chat(
            [request.messages], request.build_chat_params(None, "auto"), request.build_tok_params(ref.model_config)
        )
    else:
        request = CompletionRequest(**body)
        texts = request.prompt if isinstance(request.prompt, list) else [request.prompt]  # one prompt each
        prompts = ref.renderer.render_cmpl(
            [{"prompt": text} for text in texts], request.build_tok_params(ref.model_config)
        )
    return prompts[0]["prompt_token_ids"]
