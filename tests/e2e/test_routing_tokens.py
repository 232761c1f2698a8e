"""The token ids cache-aware routing keys a prompt by equal the ids the engine really
serves, over generated text prompts and chats (with the chat options that change the
rendered prompt): the decode leg's own `prompt_token_ids` (`return_token_ids`) on the
shared stack, against both of the proxy's ways to get them: the decode worker's /tokenize
(proxy/routing/tokens.py) and the proxy's own tokenizer (proxy/routing/local_tokenizer.py,
`routing.tokenizer`, loaded from the folder the stack serves, as `pdspec up` sets it),
whose start-up check must agree with the worker too."""

import asyncio

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.routing.local_tokenizer import LocalTokenizer
from proxy.routing.tokenizer_check import TokenizerCheck
from proxy.routing.tokens import prompt_token_ids, tokenize_body
from proxy.upstream.client import UpstreamClient
from tests import harness

LOOK_ALIKES = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start", "<s>", "[INST]", "  ", "\n\n", "\t", "🙂"]
plain_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=120)
text = st.one_of(plain_text, st.lists(st.one_of(plain_text, st.sampled_from(LOOK_ALIKES)), min_size=1).map("".join))
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]), "content": text}),
    min_size=1,
    max_size=4,
)
EXAMPLES = settings(
    max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def local():
    """The proxy's own tokenizer of the model the stack serves (its `routing.tokenizer`)."""
    tokenizer = LocalTokenizer.load(harness.models_dir() / "target")
    yield tokenizer
    tokenizer.close()


def served_ids(stack, path: str, body: dict) -> list[int]:
    response = httpx.post(stack.proxy_url + path, json={**body, "max_tokens": 1, "return_token_ids": True}, timeout=120)
    assert response.status_code == 200, response.text
    data = response.json()
    return data["choices"][0].get("prompt_token_ids") or data.get("prompt_token_ids")


def tokenized(stack, body: dict, chat: bool) -> list[int]:
    response = httpx.post(stack.decode_url + "/tokenize", json=tokenize_body(body, chat), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def proxy_ids(local: LocalTokenizer, body: dict, chat: bool) -> list[int] | None:
    return asyncio.run(local.prompt_ids(body, chat))


@EXAMPLES
@given(prompt=text, special=st.sampled_from([None, True, False]))
def test_text_prompts(stack, local, prompt, special):
    body = {"model": "pdspec-tiny", "prompt": prompt}
    if special is not None:
        body["add_special_tokens"] = special
    served = served_ids(stack, "/v1/completions", body)
    assert tokenized(stack, body, chat=False) == served
    assert proxy_ids(local, body, chat=False) == served


@EXAMPLES
@given(chat=messages, generation_prompt=st.booleans())
def test_chats(stack, local, chat, generation_prompt):
    body = {"model": "pdspec-tiny", "messages": chat, "add_generation_prompt": generation_prompt}
    served = served_ids(stack, "/v1/chat/completions", body)
    assert tokenized(stack, body, chat=True) == served
    assert proxy_ids(local, body, chat=True) == served  # plain chats: rendered in the proxy, never None


def test_the_proxys_check_agrees_with_the_decode_worker(stack, local):
    """What a kv_aware proxy with this tokenizer decides at start-up, against this worker:
    both kinds tokenized in the proxy."""

    async def check() -> tuple[bool | None, bool | None]:
        client = UpstreamClient()
        try:

            async def ask(url: str, body: dict, chat: bool) -> list[int] | None:
                return await prompt_token_ids(client, url, body, chat, 30.0)

            checker = TokenizerCheck(local, ask)
            await checker.run(stack.decode_url)
            return checker.agreement.text, checker.agreement.chat
        finally:
            client.close()

    assert asyncio.run(check()) == (True, True)
