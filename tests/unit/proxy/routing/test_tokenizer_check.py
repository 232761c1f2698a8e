"""proxy/routing/tokenizer_check.py: the proxy tokenizes a kind of prompt itself only
once a worker's /tokenize gave the same ids for every probe of that kind; one probe that
differs turns it off for good (with a warning that says where); a worker that does not
answer leaves it unknown, and it is asked again. The same probes against vLLM's own
renderer: test_local_tokenizer_differential.py; through a running proxy:
test_kv_router_tokenizer.py."""

import asyncio
import logging

import pytest

from pdspec.models.build import SHIPPED
from proxy.routing.local_tokenizer import LocalTokenizer
from proxy.routing.tokenizer_check import CHAT_PROBES, TEXT_PROBES, TokenizerCheck, compare, probes


@pytest.fixture(scope="module")
def shipped():
    tokenizer = LocalTokenizer.load(SHIPPED / "target")
    yield tokenizer
    tokenizer.close()


class Worker:
    """A worker's /tokenize: the proxy's own ids unless told otherwise; notes what it was asked."""

    def __init__(self, tokenizer: LocalTokenizer, differ_on: str | None = None, silent: bool = False):
        self.tokenizer, self.differ_on, self.silent = tokenizer, differ_on, silent
        self.asked: list[tuple[str, dict, bool]] = []

    async def __call__(self, url: str, body: dict, chat: bool) -> list[int] | None:
        self.asked.append((url, body, chat))
        if self.silent:
            return None
        ids = await self.tokenizer.prompt_ids(body, chat)
        if self.differ_on is not None and self.differ_on in repr(body):
            ids = [*ids[:3], 99_999, *ids[3:]]
        return ids


def test_the_probes_cover_both_special_token_settings_and_the_tokenizers_own_specials(shipped):
    text = probes(shipped, chat=False)
    assert {body["prompt"] for body in text} >= set(TEXT_PROBES)
    assert sorted(body["add_special_tokens"] for body in text) == [False] * (len(text) // 2) + [True] * (len(text) // 2)
    own = [body["prompt"] for body in text if body["prompt"] not in TEXT_PROBES]
    assert own and all(token in own[0] for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    assert probes(shipped, chat=True) == list(CHAT_PROBES)


async def test_agreement_on_every_probe(shipped):
    worker = Worker(shipped)
    assert await compare(shipped, lambda body, chat: worker("w", body, chat), chat=False) == (True, None)
    assert len(worker.asked) == len(probes(shipped, chat=False))


async def test_one_probe_that_differs_says_where(shipped):
    worker = Worker(shipped, differ_on="look-alikes")
    agreed, why = await compare(shipped, lambda body, chat: worker("w", body, chat), chat=False)
    assert agreed is False and "look-alikes" in why and "from id 3 on" in why and "99999" in why


async def test_a_silent_worker_decides_nothing(shipped):
    worker = Worker(shipped, silent=True)
    assert await compare(shipped, lambda body, chat: worker("w", body, chat), chat=True) == (None, None)
    assert len(worker.asked) == 1  # it stopped at the first unanswered probe


async def test_text_and_chats_are_decided_apart_and_logged(shipped, caplog):
    worker = Worker(shipped, differ_on="first turn")  # a chat probe: another template on the worker
    check = TokenizerCheck(shipped, worker)
    with caplog.at_level(logging.INFO, "pdspec.proxy.routing"):
        check.start("http://d:1")
        await check._task
    assert (check.agreement.text, check.agreement.chat) == (True, False)
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "http://d:1" in warning.getMessage() and "chats go to /tokenize" in warning.getMessage()
    assert any("text prompts tokenized in the proxy" in r.getMessage() for r in caplog.records)
    asked = len(worker.asked)
    check.start("http://d:1")  # known: never asked again
    assert check._task.done() and len(worker.asked) == asked


async def test_chats_need_the_text_probes_passed_too(shipped):
    """A chat is encoded by the same tokenizer: one the text probes refuse is not trusted
    with chats, whose few probes could pass it (another pre-tokenizer did)."""
    worker = Worker(shipped, differ_on="code")
    check = TokenizerCheck(shipped, worker)
    await check.run("http://d:1")
    assert (check.agreement.text, check.agreement.chat) == (False, False)
    assert not any(chat for _, _, chat in worker.asked)


async def test_a_worker_that_did_not_answer_is_asked_again_after_the_next_round(shipped):
    worker = Worker(shipped, silent=True)
    check = TokenizerCheck(shipped, worker)
    check.start("http://d:1")
    await check._task
    assert (check.agreement.text, check.agreement.chat) == (None, None)
    worker.silent = False
    check.start("http://d:2")  # the next health round's first healthy decode worker
    await check._task
    assert (check.agreement.text, check.agreement.chat) == (True, True)
    assert worker.asked[-1][0] == "http://d:2"


async def test_one_check_at_a_time(shipped):
    release = asyncio.Event()

    async def slow(url, body, chat):
        await release.wait()
        return await shipped.prompt_ids(body, chat)

    check = TokenizerCheck(shipped, slow)
    check.start("http://d:1")
    first = check._task
    check.start("http://d:1")
    assert check._task is first
    release.set()
    await first
    assert check.agreement.known()
    await check.close()


async def test_without_a_chat_template_chats_are_off_unasked(shipped, tmp_path):
    import shutil

    shutil.copy(SHIPPED / "target" / "tokenizer.json", tmp_path / "tokenizer.json")
    bare = LocalTokenizer.load(tmp_path)
    worker = Worker(bare)
    check = TokenizerCheck(bare, worker)
    await check.run("http://d:1")
    assert (check.agreement.text, check.agreement.chat) == (True, False)
    assert not any(chat for _, _, chat in worker.asked)
