"""Whether the proxy's own tokenizer (proxy/routing/local_tokenizer.py) gives the ids the
served engine gives: checked against a decode worker's /tokenize before the proxy uses it.

Why check: tokenizer.json alone is not always the tokenizer vLLM runs. transformers 5
rebuilds pieces of it as it loads it when the folder names a model's tokenizer class, or
names none (Qwen2Tokenizer brings its own pre-tokenizer, LlamaTokenizerFast its own
post-processor: tests/unit/proxy/routing/test_tokenizer_check_models.py), the worker may
serve another model or its own `--chat-template`, and vLLM renders some chats otherwise
(a template that iterates over content parts is given even a string as parts). Ids that
differ from the engine's would not fail a request, but they would never meet the
workers' cached blocks, so kv_aware routing would quietly lose its point.

The probes: text with and without special tokens (ASCII, runs of whitespace, Unicode
and emoji, code, look-alikes of special tokens and the tokenizer's own special tokens),
and plain chats (a system turn, several turns, empty content, with and without the
generation prompt). Each is tokenized by the proxy and by the worker's /tokenize as a
request would be (proxy/routing/tokens.py). Text prompts are decided first, then chats,
which need the same tokenizer (their probes are too few to judge it: a pre-tokenizer
that splits runs of whitespace otherwise passed them) and the same template:

- all probes of a kind equal: the proxy tokenizes that kind itself from then on (logged);
- one differs: it never does (a warning names the probe and where the ids part);
- a probe the worker did not answer (down, slow, an error): not known yet; asked again
  after the next health round (`KvRouter.sync`). Until known, the round trip as before.

The probes are a sample, not a proof: they catch a tokenizer or template that differs in
the ways the test above builds, and a different model, not a rule that touches only text
they lack. The check runs once per proxy: workers of one pool serve one model (the
pairing check refuses one that does not match the first admitted).

Failure policy: none of it fails a request or the proxy.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from proxy.routing.local_tokenizer import LocalTokenizer

log = logging.getLogger("pdspec.proxy.routing")

TEXT_PROBES = (
    "Hello, world!",
    "  two spaces, a tab\tand\n\n\nnew lines\r\n   trailing   ",
    "naïve café, 日本語のテキスト, Ελληνικά, עברית, emoji 🙂👍🏽 and a family 👨\u200d👩\u200d👧",
    "def f(x):\n    return {'a': [1, 2.5e-3, None]}  # code\n\tif x: pass\n",
    "look-alikes: <|im_start|>user\nhi<|im_end|> <s></s> [INST] <<SYS>> <|endoftext|> <unk> <|eot_id|>",
)
CHAT_PROBES: tuple[dict[str, Any], ...] = (
    {
        "messages": [
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Hi there 🙂, how are you?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "user", "content": "first turn <|im_end|> with a look-alike"},
            {"role": "assistant", "content": "  a reply\n\n"},
            {"role": "user", "content": "日本語で?"},
        ],
        "add_generation_prompt": False,
    },
    {"messages": [{"role": "user", "content": ""}]},  # the default generation prompt
)
SPECIAL_TOKEN_PROBES = 8  # how many of the tokenizer's own special tokens go in a probe


@dataclass
class Agreement:
    """What the proxy may tokenize itself: True agreed, False disagreed, None not known yet."""

    text: bool | None = None
    chat: bool | None = None

    def known(self) -> bool:
        return self.text is not None and self.chat is not None


# What the worker's /tokenize gives for a request body: (body, chat) -> ids, or None.
AskWorker = Callable[[dict[str, Any], bool], Awaitable[list[int] | None]]


def probes(tokenizer: LocalTokenizer, chat: bool) -> list[dict[str, Any]]:
    """The request bodies a kind is checked with."""
    if chat:
        return [dict(body) for body in CHAT_PROBES]
    texts = list(TEXT_PROBES)
    specials = [t.content for t in tokenizer.tokenizer.get_added_tokens_decoder().values() if t.special]
    if specials:
        texts.append("own specials: " + " x ".join(specials[:SPECIAL_TOKEN_PROBES]) + " end")
    return [{"prompt": text, "add_special_tokens": special} for text in texts for special in (True, False)]


async def compare(tokenizer: LocalTokenizer, ask: AskWorker, chat: bool) -> tuple[bool | None, str | None]:
    """(agreed, why not) for one kind: None when the worker did not answer every probe."""
    for body in probes(tokenizer, chat):
        theirs = await ask(body, chat)
        if theirs is None:
            return None, None
        ours = await tokenizer.prompt_ids(body, chat)
        if ours != theirs:
            return False, _difference(body, ours, theirs)
    return True, None


def _difference(body: dict[str, Any], ours: list[int] | None, theirs: list[int]) -> str:
    if ours is None:
        return f"the proxy cannot render {body!r} (its folder's chat template refuses it)"
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return f"{body!r}: from id {at} on, the proxy has {ours[at : at + 8]}, the worker {theirs[at : at + 8]}"


class TokenizerCheck:
    """The check's state in a running proxy: `agreement` says what the proxy may tokenize
    itself; `start(url)` checks what is not known yet against that decode worker."""

    def __init__(
        self,
        tokenizer: LocalTokenizer,
        ask: Callable[[str, dict[str, Any], bool], Awaitable[Any]],
        decided: Callable[[str, bool], None] = lambda kind, agreed: None,
    ) -> None:
        self.tokenizer = tokenizer
        self.ask = ask  # (worker url, body, chat) -> that worker's /tokenize ids, or None
        self.decided = decided  # (kind: text or chat, agreed): for the metrics
        self.agreement = Agreement()
        self._task: asyncio.Task | None = None

    def start(self, worker_url: str) -> None:
        """Check the kinds not known yet, unless a check is under way (called after every health round)."""
        if self.agreement.known() or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.ensure_future(self.run(worker_url))

    async def run(self, worker_url: str) -> None:
        ask = functools.partial(self.ask, worker_url)
        for chat, kind in ((False, "text prompts"), (True, "chats")):
            name = "chat" if chat else "text"
            if getattr(self.agreement, name) is not None:
                continue
            if chat and (self.tokenizer.chat_template is None or not self.agreement.text):
                self.agreement.chat = False
                self.decided(name, False)
                why = "has no chat template" if self.tokenizer.chat_template is None else "tokenizes text otherwise"
                log.info("routing.tokenizer %s %s: chats go to /tokenize", self.tokenizer.source, why)
                continue
            agreed, why = await compare(self.tokenizer, ask, chat)
            if agreed is None:
                log.info("%s's /tokenize did not answer the tokenizer probes; asked again later", worker_url)
                return
            setattr(self.agreement, name, agreed)
            self.decided(name, agreed)
            if agreed:
                log.info("%s tokenized in the proxy (%s agrees with %s)", kind, self.tokenizer.source, worker_url)
            else:
                log.warning(
                    "routing.tokenizer %s and %s's /tokenize disagree on %s: %s go to /tokenize",
                    self.tokenizer.source,
                    worker_url,
                    why,
                    kind,
                )

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
