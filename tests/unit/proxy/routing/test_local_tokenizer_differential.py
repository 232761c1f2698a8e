"""The proxy's own token ids (proxy/routing/local_tokenizer.py) against vLLM's, over
generated prompts: vLLM 0.32's renderer for the shipped model, built in this process as
the API server builds it and given each body through vLLM's own request models
(tests/vllm_reference.py), so the reference is the ids the engine would hold, request
options included. No server starts. Other kinds of model: test_tokenizer_check_models.py. The same against
a running worker, through the proxy, is tests/e2e/test_routing_tokens.py."""

import asyncio

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pdspec.models.build import SHIPPED
from proxy.routing.local_tokenizer import INLINE_MAX_CHARS, LocalTokenizer
from proxy.routing.tokenizer_check import compare
from tests.vllm_reference import engine_ids, reference

MODEL = SHIPPED / "target"
MAX_MODEL_LEN = 4096  # the shipped model's; vLLM refuses (and its encoder cuts) longer prompts

LOOK_ALIKES = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start",
    "im_end|>",
    "<|IM_START|>",
    "< |im_end| >",
    "<s>",
    "</s>",
    "[INST]",
    "<|eot_id|>",
    "<unk>",
    "<<SYS>>",
]
EMOJI = ["🙂", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "🧑🏿\u200d🚀", "\U0001fae0"]
CODE = [
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "SELECT * FROM t WHERE id = 'x';",
    '{"key": [1, 2.5e-3, null, true]}',
    "    \t# indented comment\n",
    "x = {'a': 1}  # dict\r\n",
]
WHITESPACE = st.text(alphabet=" \t\n\r\u00a0\u2002\u3000\u2028\x0b\x0c", min_size=1, max_size=12)
UNICODE = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
PIECE = st.one_of(
    UNICODE,
    WHITESPACE,
    st.sampled_from(LOOK_ALIKES),
    st.sampled_from(EMOJI),
    st.sampled_from(CODE),
    st.from_regex(r"[A-Za-z]{1,30}|[0-9]{1,12}|[.,;:!?'\"()-]{1,4}", fullmatch=True),
)
TEXT = st.lists(PIECE, max_size=24).map("".join)
# Past the inline limit by construction (non-empty pieces repeated), and short enough that
# nearly every draw fits the model's context even at four tokens a character: drawn texts
# filtered out by length or by the context made Hypothesis's health check fail (CI, once).
LONG_TEXT = st.lists(PIECE.filter(bool), min_size=1, max_size=8).map(
    lambda pieces: ("".join(pieces) * (INLINE_MAX_CHARS + 1))[: INLINE_MAX_CHARS + 64]
)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT})
EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def vllm_renderer():
    """vLLM's renderer of the shipped model (tests/vllm_reference.py)."""
    return reference(MODEL, MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def ours():
    tokenizer = LocalTokenizer.load(MODEL)
    yield tokenizer
    tokenizer.close()


def proxy_ids(tokenizer: LocalTokenizer, body: dict, chat: bool) -> list[int] | None:
    ids = asyncio.run(tokenizer.prompt_ids(body, chat))
    assume(ids is None or len(ids) <= MAX_MODEL_LEN)  # the engine refuses a longer one
    return ids


@EXAMPLES
@given(text=TEXT.filter(bool), special=st.sampled_from([True, False, None]))
def test_text_prompts(vllm_renderer, ours, text, special):
    body = {"prompt": text} if special is None else {"prompt": text, "add_special_tokens": special}
    assert proxy_ids(ours, body, chat=False) == engine_ids(vllm_renderer, body, chat=False)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=LONG_TEXT)
def test_long_text_prompts_encoded_off_the_event_loop(vllm_renderer, ours, text):
    body = {"prompt": [text]}
    assert proxy_ids(ours, body, chat=False) == engine_ids(vllm_renderer, body, chat=False)


def test_an_empty_prompt_is_refused_before_routing_and_has_no_ids(vllm_renderer, ours):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError):  # the proxy's validation refuses it as vLLM does (400)
        engine_ids(vllm_renderer, {"prompt": ""}, chat=False)
    assert asyncio.run(ours.prompt_ids({"prompt": ""}, chat=False)) == []


@EXAMPLES
@given(messages=st.lists(MESSAGE, min_size=1, max_size=6), generation_prompt=st.sampled_from([True, False, None]))
def test_plain_chats(vllm_renderer, ours, messages, generation_prompt):
    body = {"messages": messages}
    if generation_prompt is not None:
        body["add_generation_prompt"] = generation_prompt
    assert proxy_ids(ours, body, chat=True) == engine_ids(vllm_renderer, body, chat=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(MESSAGE, min_size=1, max_size=3), context=LONG_TEXT)
def test_long_chats(vllm_renderer, ours, messages, context):
    body = {"messages": [{"role": "system", "content": context}, *messages]}
    assert proxy_ids(ours, body, chat=True) == engine_ids(vllm_renderer, body, chat=True)


def test_the_start_up_probes_agree_with_vllm(vllm_renderer, ours):
    """The check a running proxy makes against a worker's /tokenize (tokenizer_check.py)
    passes for the shipped model: both kinds are tokenized in the proxy."""

    async def ask(body, chat):
        return engine_ids(vllm_renderer, body, chat)

    assert asyncio.run(compare(ours, ask, chat=False)) == (True, None)
    assert asyncio.run(compare(ours, ask, chat=True)) == (True, None)
