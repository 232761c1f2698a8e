"""proxy/routing/chat_template.py: which chats the proxy renders itself (plain ones only),
its template environment against transformers' own `apply_chat_template` on templates
that use what transformers gives them, and where a model folder's template and special
tokens come from. The rendered ids against vLLM's: test_local_tokenizer_differential.py."""

import json

import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from pdspec.models.build import SHIPPED
from proxy.routing.chat_template import ChatTemplate, ChatTemplateError, plain_chat

PLAIN = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "And?"},
    ],
    "temperature": 0.5,  # sampling options change nothing rendered
}
# What transformers hands a template, used: special tokens, tojson of non-ASCII with its
# options, loop controls, {% generation %}, blocks on lines of their own (trim_blocks and
# lstrip_blocks), a namespace, raise_exception.
TEMPLATE = """{{ bos_token }}
{% set ns = namespace(turns=0) %}
{% for message in messages %}
    {% if message['role'] == 'system' %}
        {{- '[SYS]' + message['content'] | trim + '[/SYS]' }}
        {% continue %}
    {% endif %}
    {% set ns.turns = ns.turns + 1 %}
    {% if message['role'] == 'assistant' %}
        {% generation %}{{ message['content'] + eos_token }}{% endgeneration %}
    {% else %}
        {{ {'role': message['role'], 'text': message['content'], 'n': ns.turns} | tojson }}
        {{ message['content'] | tojson(indent=2, sort_keys=True) }}
    {% endif %}
    {% if message['content'] == 'STOP' %}{% break %}{% endif %}
    {% if message['content'] == 'REFUSE' %}{{ raise_exception('refused: ' + message['content']) }}{% endif %}
{% endfor %}
{% if add_generation_prompt %}<assistant>{% endif %}"""
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def body(**fields) -> dict:
    return {**PLAIN, **fields}


def test_a_plain_chat_is_rendered_here():
    assert plain_chat(PLAIN) == (PLAIN["messages"], True)  # vLLM's default generation prompt
    assert plain_chat(body(add_generation_prompt=False)) == (PLAIN["messages"], False)
    # Unset values change nothing vLLM renders: it drops them before the template.
    unset = body(tools=None, documents=None, chat_template=None, chat_template_kwargs={}, reasoning_effort=None)
    assert plain_chat({**unset, "continue_final_message": False, "add_special_tokens": False}) is not None


@pytest.mark.parametrize(
    "change",
    [
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tools": []},  # vLLM passes [] on, and picks the template by it
        {"documents": [{"title": "t", "text": "x"}]},
        {"chat_template": "{{ messages }}"},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"reasoning_effort": "low"},  # a template variable of its own in vLLM
        {"continue_final_message": True, "add_generation_prompt": False},
        {"add_special_tokens": True},
        {"add_generation_prompt": "yes"},
        {"messages": []},
        {"messages": "Hi"},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]},  # content parts: joined by vLLM
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": [{"role": "user", "content": None}]},
        {"messages": [{"role": "user", "content": "Hi", "name": "ann"}]},
        {"messages": [{"role": "developer", "content": "Be brief."}]},  # made a system turn by vLLM
        {"messages": [{"role": "tool", "content": "42", "tool_call_id": "c"}]},
        {"messages": [{"role": "assistant", "content": "", "tool_calls": []}]},
        {"messages": [{"role": "system", "content": "x-anthropic-billing-header: cch=1\nBe brief."}]},  # vLLM drops it
        {"messages": [{"role": "user"}]},
        {"messages": ["Hi"]},
    ],
)
def test_anything_vllm_would_change_before_its_template_goes_to_the_worker(change):
    assert plain_chat(body(**change)) is None


def transformers_render(template: str, messages: list[dict], generation_prompt: bool) -> str:
    reference = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(SHIPPED / "target" / "tokenizer.json")), **SPECIALS
    )
    reference.chat_template = template
    return reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize(
    "messages",
    [
        PLAIN["messages"],
        [{"role": "user", "content": "naïve 日本語 🙂 <\"quoted\"> & 'single'"}, {"role": "user", "content": "STOP"}],
        [{"role": "system", "content": "  padded \n"}, {"role": "user", "content": "after"}],
    ],
)
def test_rendered_as_transformers_renders_it(messages, generation_prompt):
    ours = ChatTemplate(TEMPLATE, SPECIALS).render(messages, generation_prompt)
    assert ours == transformers_render(TEMPLATE, messages, generation_prompt)
    assert "日本語" in ours or "naïve" not in json.dumps(messages)  # tojson keeps non-ASCII, as transformers' does


def test_a_template_that_refuses_a_chat_renders_nothing():
    template = ChatTemplate(TEMPLATE, SPECIALS)
    assert template.render([{"role": "user", "content": "REFUSE"}], True) is None


def write(folder, name: str, content) -> None:
    (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))


def test_the_folders_jinja_file_comes_first_then_its_config(tmp_path):
    write(tmp_path, "tokenizer_config.json", {"chat_template": "config {{ eos_token }}", "eos_token": "</s>"})
    assert ChatTemplate.from_folder(tmp_path).render([], False) == "config </s>"
    write(tmp_path, "chat_template.jinja", "file {{ eos_token }}")
    assert ChatTemplate.from_folder(tmp_path).render([], False) == "file </s>"


def test_named_templates_give_the_default_one(tmp_path):
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]
    write(tmp_path, "tokenizer_config.json", {"chat_template": named})
    assert ChatTemplate.from_folder(tmp_path).render([], False) == "plain"
    write(tmp_path, "tokenizer_config.json", {"chat_template": [{"name": "tool_use", "template": "tools"}]})
    assert ChatTemplate.from_folder(tmp_path) is None


def test_special_tokens_as_the_config_writes_them_and_the_legacy_map(tmp_path):
    write(
        tmp_path,
        "tokenizer_config.json",
        {
            "chat_template": "x",
            "bos_token": {"content": "<s>", "lstrip": False},
            "eos_token": "</s>",
            "unk_token": None,
        },
    )
    write(tmp_path, "special_tokens_map.json", {"eos_token": "ignored", "pad_token": {"content": "<pad>"}})
    assert ChatTemplate.from_folder(tmp_path).special_tokens == {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
    }


def test_a_folder_without_a_template_has_none(tmp_path):
    assert ChatTemplate.from_folder(tmp_path) is None
    write(tmp_path, "tokenizer_config.json", {"eos_token": "</s>"})
    assert ChatTemplate.from_folder(tmp_path) is None


@pytest.mark.parametrize(
    "name, content",
    [("chat_template.jinja", "{% for m in messages %}no end"), ("tokenizer_config.json", "{not json")],
)
def test_a_template_that_cannot_be_read_or_compiled_is_an_error(tmp_path, name, content):
    write(tmp_path, name, content)
    with pytest.raises(ChatTemplateError, match="chat template|tokenizer_config"):
        ChatTemplate.from_folder(tmp_path)


def test_the_shipped_models_template_is_read_from_its_folder():
    template = ChatTemplate.from_folder(SHIPPED / "target")
    assert template.source == (SHIPPED / "target" / "chat_template.jinja").read_text()
    assert template.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
