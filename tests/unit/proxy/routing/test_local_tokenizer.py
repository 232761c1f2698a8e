"""proxy/routing/local_tokenizer.py: loading `routing.tokenizer` (a folder or a file, and
the errors that stop the proxy), which request bodies it tokenizes, and where it encodes
(inline when short, on its own threads when long). Its ids against vLLM's:
test_local_tokenizer_differential.py."""

import shutil
import threading

import pytest

from pdspec.models.build import SHIPPED
from proxy.routing.local_tokenizer import INLINE_MAX_CHARS, LocalTokenizer, TokenizerLoadError

MODEL = SHIPPED / "target"


@pytest.fixture(scope="module")
def shipped():
    tokenizer = LocalTokenizer.load(MODEL)
    yield tokenizer
    tokenizer.close()


def test_a_model_folder_or_its_tokenizer_json(tmp_path):
    folder = LocalTokenizer.load(MODEL)
    assert folder.source == MODEL / "tokenizer.json" and folder.chat_template is not None
    file = LocalTokenizer.load(MODEL / "tokenizer.json")  # its folder's template comes along
    assert file.chat_template.source == folder.chat_template.source
    shutil.copy(MODEL / "tokenizer.json", tmp_path / "tokenizer.json")
    alone = LocalTokenizer.load(tmp_path)  # no template: chats take the round trip
    assert alone.chat_template is None and alone.encode("hi", True) == folder.encode("hi", True)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: tmp / "missing", "missing does not exist"),
        (lambda tmp: tmp, "has no tokenizer.json"),
        (lambda tmp: _write(tmp / "tokenizer.json", "{not json"), "cannot be read as a tokenizer"),
        (lambda tmp: _write(tmp / "tokenizer.json", '{"version": "1.0"}'), "cannot be read as a tokenizer"),
        (lambda tmp: _copy_with_template(tmp, "{% if %}"), "chat template does not compile"),
    ],
)
def test_a_tokenizer_that_cannot_be_loaded_is_an_error_naming_it(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(TokenizerLoadError, match=message) as error:
        LocalTokenizer.load(path)
    assert str(error.value).startswith("routing.tokenizer: ") and str(tmp_path) in str(error.value)


def _write(path, text):
    path.write_text(text)
    return path


def _copy_with_template(tmp, template):
    shutil.copy(MODEL / "tokenizer.json", tmp / "tokenizer.json")
    (tmp / "chat_template.jinja").write_text(template)
    return tmp


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"prompt": "abc"}, ("abc", True)),  # vLLM's default: special tokens added
        ({"prompt": ["abc"], "add_special_tokens": False}, ("abc", False)),
        ({"prompt": ["a", "b"]}, None),  # several prompts: each its own request, not routed as one
        ({"prompt": [1, 2, 3]}, None),  # ids: used as they are (tokens.direct_token_ids)
        ({"prompt": "abc", "add_special_tokens": "no"}, None),
        ({"messages": []}, None),
    ],
)
def test_which_completions_bodies_it_tokenizes(shipped, body, expected):
    assert shipped.text_prompt(body) == expected


async def test_chats_it_cannot_render_exactly_give_no_ids(shipped, tmp_path):
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert await shipped.prompt_ids(chat, chat=True) == shipped.encode(shipped.chat_text(chat), False)
    assert await shipped.prompt_ids({**chat, "tools": [{"type": "function"}]}, chat=True) is None
    shutil.copy(MODEL / "tokenizer.json", tmp_path / "tokenizer.json")
    assert await LocalTokenizer.load(tmp_path).prompt_ids(chat, chat=True) is None  # no template


class ThreadRecorder:
    """The tokenizer, noting the thread each encoding ran on."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.threads: list[str] = []

    def encode(self, *args, **kwargs):
        self.threads.append(threading.current_thread().name)
        return self.tokenizer.encode(*args, **kwargs)

    def encode_batch_fast(self, *args, **kwargs):
        self.threads.append(threading.current_thread().name)
        return self.tokenizer.encode_batch_fast(*args, **kwargs)


async def test_short_text_is_encoded_inline_and_long_text_on_the_tokenizers_threads():
    tokenizer = LocalTokenizer.load(MODEL)
    reference = tokenizer.tokenizer
    tokenizer.tokenizer = recorder = ThreadRecorder(reference)
    short, long = "x = 1\n" * (INLINE_MAX_CHARS // 6), "y = 2\n" * (INLINE_MAX_CHARS // 6 + 1)
    try:
        assert await tokenizer.prompt_ids({"prompt": short}, chat=False) == reference.encode(short).ids
        assert recorder.threads == [threading.current_thread().name] and tokenizer._pool is None
        for special in (True, False):
            ids = await tokenizer.prompt_ids({"prompt": long, "add_special_tokens": special}, chat=False)
            assert ids == reference.encode(long, add_special_tokens=special).ids
        assert len(recorder.threads) == 3 and all(t.startswith("pdspec-tokenize") for t in recorder.threads[1:])
    finally:
        tokenizer.close()
    assert tokenizer._pool is None
