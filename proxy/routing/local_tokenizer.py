"""A prompt's token ids computed in the proxy with the served model's own tokenizer
(`routing.tokenizer`), instead of a round trip to a decode worker's /tokenize.

The model's tokenizer.json runs in Hugging Face's Rust `tokenizers`, the library under
the fast tokenizer vLLM loads through transformers; chats are rendered first by
proxy/routing/chat_template.py. What it tokenizes, and why the ids equal the engine's:

- a completions prompt of text (one string): `encode(prompt, add_special_tokens)`, as
  vLLM 0.32 encodes it (its renderer's TokenizeParams: the request's
  `add_special_tokens`, True by default; it truncates only past max_model_len, a prompt
  the engine refuses anyway). `truncate_prompt_tokens` is applied on neither this path
  nor the round trip: such a prompt is keyed by its whole text;
- a plain chat (chat_template.py's `plain_chat`): its template's text, encoded without
  special tokens (the template writes them), as transformers' `apply_chat_template`
  encodes it for vLLM.

Anything else answers None and the caller asks the worker (proxy/routing/tokens.py): a
chat with tools, tool calls, content parts or multimodal content, names, developer turns
or template options; a model folder without a chat template; several prompts; Responses
and Messages bodies (their render endpoints run vLLM's own conversions). Whether the
ids really agree with the served engine's (a tokenizer.json that transformers adjusts
when it loads it, another model, a server-side template) is checked against a decode
worker before the proxy uses them: proxy/routing/tokenizer_check.py.

Threading: encoding holds its thread for about 0.25 µs a character on the 2-core CPU here
(a 2,048-token prompt of code, 7,600 characters: 1.9 ms of CPU; loadtest/results/routing_cost/).
Text longer than `INLINE_MAX_CHARS` is encoded on a thread of the tokenizer's own pool by
`encode_batch_fast`, which releases the GIL while it works (`Tokenizer.encode` holds it
throughout: on a thread it would still stop the loop). The pool is its own (`POOL_THREADS`
at most, no more than the cores), so the event loop's other thread work, such as name
resolution, never waits behind a burst of long prompts; the loop pays about 0.1 ms a
prompt whatever its length. Shorter text is encoded inline: at most about 0.25 ms, about
what the hand-off to a thread would cost the loop anyway.

Failure policy: `load` raises TokenizerLoadError, naming the file and the reason, for a
path that is missing or a file that is not a tokenizer (or a chat template that does not
compile); the proxy does not start with it. After that nothing here fails a request: a
body it cannot tokenize exactly, or a template that refuses it, gives None.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from proxy.routing.chat_template import ChatTemplate, ChatTemplateError, plain_chat

# Text up to this many characters is encoded on the event loop (at most about 0.25 ms here).
INLINE_MAX_CHARS = 1024
POOL_THREADS = 4


class TokenizerLoadError(Exception):
    """`routing.tokenizer` names no usable tokenizer."""


class LocalTokenizer:
    def __init__(self, tokenizer, chat_template: ChatTemplate | None, source: Path) -> None:
        self.tokenizer = tokenizer  # tokenizers.Tokenizer
        self.chat_template = chat_template
        self.source = source
        self._pool: ThreadPoolExecutor | None = None  # started on the first long prompt

    @classmethod
    def load(cls, path: Path) -> LocalTokenizer:
        """The tokenizer of a model folder (its tokenizer.json, and its chat template when
        it has one) or of a tokenizer.json file (its folder's chat template)."""
        from tokenizers import Tokenizer  # only a proxy that routes on the caches needs it

        path = Path(path).expanduser()
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            where = f"{path} has no tokenizer.json" if path.is_dir() else f"{path} does not exist"
            raise TokenizerLoadError(f"routing.tokenizer: {where}")
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises plain Exceptions for every kind of bad file
            raise TokenizerLoadError(f"routing.tokenizer: {file} cannot be read as a tokenizer: {exc}") from exc
        try:
            template = ChatTemplate.from_folder(file.parent)
        except ChatTemplateError as exc:
            raise TokenizerLoadError(f"routing.tokenizer: {file.parent}: {exc}") from exc
        return cls(tokenizer, template, file)

    # --- the ids ---------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """`text`'s ids, on the calling thread (`encode_batch_fast` of one text: `encode`'s
        ids without its character offsets, about a fifth cheaper)."""
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    async def encode_async(self, text: str, add_special_tokens: bool) -> list[int]:
        """`text`'s ids: inline when short, else on the tokenizer's threads (the GIL released)."""
        if len(text) <= INLINE_MAX_CHARS:
            return self.encode(text, add_special_tokens)
        if self._pool is None:
            threads = min(POOL_THREADS, os.cpu_count() or 1)
            self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pdspec-tokenize")
        encode = self.tokenizer.encode_batch_fast  # no character offsets: nothing here reads them
        # The ids' list is built on the pool's thread too: for 2,000 ids, some of the loop's
        # time per prompt otherwise.
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: encode([text], add_special_tokens=add_special_tokens)[0].ids
        )

    def text_prompt(self, body: dict[str, Any]) -> tuple[str, bool] | None:
        """(text, add_special_tokens) of a completions body of one text prompt, else None."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        add_special_tokens = body.get("add_special_tokens", True)
        if not isinstance(prompt, str) or type(add_special_tokens) is not bool:
            return None
        return prompt, add_special_tokens

    def chat_text(self, body: dict[str, Any]) -> str | None:
        """The prompt text of a plain chat as the model's template renders it, else None."""
        if self.chat_template is None:
            return None
        chat = plain_chat(body)
        return self.chat_template.render(*chat) if chat is not None else None

    async def prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int] | None:
        """A completions or chat request's prompt ids, or None where the worker must say."""
        if chat:
            text = self.chat_text(body)
            return await self.encode_async(text, add_special_tokens=False) if text is not None else None
        prompt = self.text_prompt(body)
        return await self.encode_async(*prompt) if prompt is not None else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
