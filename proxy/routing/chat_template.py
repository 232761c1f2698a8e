"""A model's chat template rendered in the proxy, as vLLM 0.32 renders a plain chat, for
cache-aware routing's token ids (proxy/routing/local_tokenizer.py encodes the text).

How vLLM renders a chat: it parses the messages into its own conversation (content parts
joined, tool-call arguments parsed, developer turns made system turns where the template
has none, Claude Code's billing header line dropped from system text, multimodal
placeholders), then calls transformers' `apply_chat_template`: the template compiled in
jinja2's sandbox as transformers compiles it (`trim_blocks`, `lstrip_blocks`, the
`loopcontrols` extension, a `{% generation %}` block, a `tojson` filter that keeps
non-ASCII, `raise_exception`, `strftime_now`) and given `messages`, `tools`, `documents`,
`add_generation_prompt` and the tokenizer's named special tokens (`bos_token`,
`eos_token`, ...), then encodes the text without adding special tokens.

The proxy copies only the last step, so it renders only a **plain chat** (`plain_chat`):
one that vLLM's parsing hands to the template unchanged. Every message is exactly
`{"role", "content"}`, the role `system`, `user` or `assistant`, the content a string (a
system one not starting with the billing header); the request sets none of `tools`,
`documents`, `chat_template`, `chat_template_kwargs`, `reasoning_effort`,
`continue_final_message`, `add_special_tokens` (False, the default, aside) and gives
`add_generation_prompt`, if at all, as a boolean. Everything else (tools and tool calls,
content parts and multimodal content, names, developer turns, template options) goes to
a decode worker's /tokenize, which runs vLLM's own parsing.

Where the template comes from (`ChatTemplate.from_folder`): the model folder's
`chat_template.jinja`, else its tokenizer_config.json's `chat_template` (a string, or the
template named `default` of a list); the special tokens from tokenizer_config.json, then
special_tokens_map.json, as transformers reads them. A server started with its own
`--chat-template`, or server-side template defaults, render otherwise: the proxy's probe
against the worker's /tokenize (proxy/routing/tokenizer_check.py) catches that before any
chat is rendered here.

Failure policy: a folder without a template gives None (chats take the round trip); a
template that does not compile raises ChatTemplateError (the proxy's start-up fails,
naming it); a render that raises (the template's own `raise_exception`) gives None, and
the round trip answers as vLLM would.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

# Named special tokens transformers hands every template (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
PLAIN_ROLES = frozenset(("system", "user", "assistant"))
# Request fields that change what vLLM renders in ways the proxy does not copy. One given
# as None (an empty chat_template_kwargs, False for the flags) changes nothing: vLLM
# drops unset values before it renders.
ROUND_TRIP_FIELDS = ("tools", "documents", "chat_template", "chat_template_kwargs", "reasoning_effort")
ROUND_TRIP_FLAGS = ("continue_final_message", "add_special_tokens")
# vLLM drops this line from system text (renderers/chat_utils.py, _strip_claude_code_billing_header).
BILLING_HEADER = "x-anthropic-billing-header"


class ChatTemplateError(Exception):
    """A model's chat template that cannot be read or compiled."""


def plain_chat(body: dict[str, Any]) -> tuple[list[dict[str, str]], bool] | None:
    """(messages, add_generation_prompt) of a chat request the proxy renders exactly as
    vLLM would (the module's docstring says which), or None for one that needs vLLM's own
    parsing."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    for name in ROUND_TRIP_FIELDS:
        value = body.get(name)
        if value is not None and not (name == "chat_template_kwargs" and value == {}):
            return None
    if any(body.get(flag) not in (None, False) for flag in ROUND_TRIP_FLAGS):
        return None
    generation_prompt = body.get("add_generation_prompt", True)
    if type(generation_prompt) is not bool:
        return None
    for message in messages:
        if not isinstance(message, dict) or message.keys() != {"role", "content"}:
            return None
        role, content = message["role"], message["content"]
        if role not in PLAIN_ROLES or type(content) is not str:
            return None
        if role == "system" and content.startswith(BILLING_HEADER):
            return None
    return messages, generation_prompt


def _raise_exception(message: str):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    # transformers' filter: jinja2's own escapes HTML characters, which no prompt wants.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.cache
def _environment():
    """The environment transformers compiles chat templates in (jinja2 is imported only by a
    proxy that renders chats)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.sandbox

    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: transformers marks assistant text with
        it (for its assistant-token masks); rendering, it is its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller) -> str:
            return caller()

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


def compile_template(source: str):
    """`source` compiled in the environment transformers compiles chat templates in."""
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template does not compile: {exc}") from exc


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        import jinja2

        self.source = source
        self.special_tokens = special_tokens
        self.template = compile_template(source)
        self._refusal = jinja2.TemplateError

    @classmethod
    def from_folder(cls, folder: Path) -> ChatTemplate | None:
        """The template and special tokens of a model folder; None when it has no template."""
        config = _json_file(folder / "tokenizer_config.json")
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            try:
                source = jinja_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ChatTemplateError(f"{jinja_file}: {exc}") from exc
        else:
            source = _config_template(config.get("chat_template"))
        if source is None:
            return None
        legacy = _json_file(folder / "special_tokens_map.json")
        tokens = {}
        for name in SPECIAL_TOKEN_NAMES:
            value = _token_text(config.get(name))
            value = value if value is not None else _token_text(legacy.get(name))
            if value is not None:
                tokens[name] = value
        return cls(source, tokens)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str | None:
        """The prompt text of a plain chat (`plain_chat`), or None when the template refuses it."""
        try:
            return self.template.render(
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except self._refusal:
            return None


def _config_template(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # named templates: transformers takes `default` without tools
        for entry in value:
            if isinstance(entry, dict) and entry.get("name") == "default" and isinstance(entry.get("template"), str):
                return entry["template"]
    return None


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's fields."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ChatTemplateError(f"{path}: {exc}") from exc
    return data if isinstance(data, dict) else {}
