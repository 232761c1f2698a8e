"""The start-up check (proxy/routing/tokenizer_check.py) against vLLM's own renderer for
kinds of model folder other than the shipped one, built here from its tokenizer: where
the proxy's ids are the engine's, the check agrees and generated prompts agree too; where
they are not, the check says so and that kind of prompt keeps the /tokenize round trip.

- a tokenizer whose post-processor adds a BOS, with a template that writes `bos_token`
  (Llama 3's way): text with and without special tokens, chats without a second BOS;
- a template that iterates over content parts (vLLM then hands it even string content as
  parts): agreed when it renders parts as it renders strings, not when it renders them
  otherwise;
- a folder whose transformers tokenizer class rebuilds the tokenizer.json's pieces as it
  loads it (transformers 5's Qwen2Tokenizer, picked by config.json's model_type when
  tokenizer_config.json names no class, brings its own pre-tokenizer; LlamaTokenizerFast
  its own post-processor): vLLM runs another tokenizer than the file, the check refuses.
"""

import asyncio
import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, processors

from pdspec.models.build import SHIPPED
from proxy.routing.local_tokenizer import LocalTokenizer
from proxy.routing.tokenizer_check import TokenizerCheck
from tests.vllm_reference import engine_ids, reference

SOURCE = SHIPPED / "target"
BOS = "<|begin_of_text|>"
LLAMA_STYLE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim + '<|im_end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PARTS_ALIKE = (
    "{% for m in messages %}<{{ m['role'] }}>{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}</{{ m['role'] }}>{% endfor %}"
)
PARTS_OTHERWISE = PARTS_ALIKE.replace("{{ part['text'] }}", "[{{ part['text'] }}]")
FAST = "PreTrainedTokenizerFast"  # tokenizer.json as it is
KINDS = {
    # name: (tokenizer_config.json, a BOS post-processor, (text agrees, chats agree))
    "bos": (
        {"bos_token": BOS, "eos_token": "<|im_end|>", "tokenizer_class": FAST, "chat_template": LLAMA_STYLE},
        True,
        (True, True),
    ),
    "parts_alike": (
        {"eos_token": "<|im_end|>", "tokenizer_class": FAST, "chat_template": PARTS_ALIKE},
        False,
        (True, True),
    ),
    "parts_otherwise": (
        {"eos_token": "<|im_end|>", "tokenizer_class": FAST, "chat_template": PARTS_OTHERWISE},
        False,
        (True, False),
    ),
    "class_pre_tokenizer": ({"eos_token": "<|im_end|>", "chat_template": LLAMA_STYLE}, False, (False, False)),
    "class_post_processor": (
        {
            "bos_token": BOS,
            "eos_token": "<|im_end|>",
            "tokenizer_class": "LlamaTokenizerFast",
            "add_eos_token": True,
            "chat_template": LLAMA_STYLE,
        },
        True,
        (False, False),
    ),
}


def model_folder(root, config: dict, bos: bool):
    root.mkdir()
    shutil.copy(SOURCE / "config.json", root / "config.json")  # model_type qwen3
    tokenizer = Tokenizer.from_file(str(SOURCE / "tokenizer.json"))
    if bos:
        tokenizer.add_special_tokens([AddedToken(BOS, special=True, normalized=False)])
        bos_id = tokenizer.token_to_id(BOS)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
    tokenizer.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request, tmp_path_factory):
    config, bos, expected = KINDS[request.param]
    folder = model_folder(tmp_path_factory.mktemp("models") / request.param, config, bos)
    tokenizer = LocalTokenizer.load(folder)
    yield request.param, tokenizer, reference(folder), expected
    tokenizer.close()


def test_the_check_agrees_exactly_where_the_engine_does(kind):
    name, tokenizer, ref, expected = kind

    async def ask(url, body, chat):
        return engine_ids(ref, body, chat)

    check = TokenizerCheck(tokenizer, ask)
    asyncio.run(check.run("vllm"))
    assert (check.agreement.text, check.agreement.chat) == expected, name


TEXT = st.lists(
    st.one_of(
        st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30),
        st.sampled_from([BOS, "<|im_start|>", "<|im_end|>", "\n    ", "  \t", "🙂", "def f(x):\n"]),
    ),
    min_size=1,
    max_size=12,
).map("".join)
MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT}),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT.filter(bool), special=st.booleans(), messages=MESSAGES, generation_prompt=st.booleans())
def test_where_the_check_agrees_generated_prompts_agree_too(kind, text, special, messages, generation_prompt):
    name, tokenizer, ref, (text_agrees, chats_agree) = kind
    if text_agrees:
        body = {"prompt": text, "add_special_tokens": special}
        assert asyncio.run(tokenizer.prompt_ids(body, False)) == engine_ids(ref, body, False), name
    if chats_agree:
        body = {"messages": messages, "add_generation_prompt": generation_prompt}
        assert asyncio.run(tokenizer.prompt_ids(body, True)) == engine_ids(ref, body, True), name
