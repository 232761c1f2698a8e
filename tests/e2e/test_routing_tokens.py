"""The token ids cache-aware routing keys a prompt by (proxy/routing/tokens.py: the
decode worker's /tokenize) equal the ids the engine really serves, over generated text
prompts and chats (with the chat options that change the rendered prompt): the decode
leg's own `prompt_token_ids` (`return_token_ids`) on the shared stack."""

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.routing.tokens import tokenize_body

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=120)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]), "content": text}),
    min_size=1,
    max_size=4,
)
EXAMPLES = settings(
    max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def served_ids(stack, path: str, body: dict) -> list[int]:
    response = httpx.post(stack.proxy_url + path, json={**body, "max_tokens": 1, "return_token_ids": True}, timeout=120)
    assert response.status_code == 200, response.text
    data = response.json()
    return data["choices"][0].get("prompt_token_ids") or data.get("prompt_token_ids")


def tokenized(stack, body: dict, chat: bool) -> list[int]:
    response = httpx.post(stack.decode_url + "/tokenize", json=tokenize_body(body, chat), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


@EXAMPLES
@given(prompt=text)
def test_text_prompts(stack, prompt):
    body = {"model": "pdspec-tiny", "prompt": prompt}
    assert tokenized(stack, body, chat=False) == served_ids(stack, "/v1/completions", body)


@EXAMPLES
@given(chat=messages, generation_prompt=st.booleans())
def test_chats(stack, chat, generation_prompt):
    body = {"model": "pdspec-tiny", "messages": chat, "add_generation_prompt": generation_prompt}
    assert tokenized(stack, body, chat=True) == served_ids(stack, "/v1/chat/completions", body)
