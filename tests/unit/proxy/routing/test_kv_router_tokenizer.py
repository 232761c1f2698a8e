"""Cache-aware routing with `routing.tokenizer` (proxy/routing/kv_router.py), a real proxy
in front of stand-in workers: once the decode worker's /tokenize agrees with the proxy's
tokenizer on the probes, text prompts and plain chats are routed on the proxy's own ids
with no /tokenize call, what it cannot render still goes to /tokenize, and a worker that
tokenizes otherwise keeps every request on the round trip. The source of each prompt's
ids is counted (pdspec_proxy_prompt_token_ids_total)."""

import httpx
import pytest

from pdspec.models.build import SHIPPED
from proxy.routing.kv_index import block_keys
from proxy.routing.local_tokenizer import LocalTokenizer
from tests.harness import wait_for
from tests.proxy_cluster import Fleet, sample

MODEL = SHIPPED / "target"
INFO = {"model": "/m/t", "method": "eagle3", "block_size": "4", "vllm_version": "0.32.0", "drafts_policy": "auto"}
ROUTING = {
    "routing": {"prefill_policy": "kv_aware", "decode_policy": "kv_aware", "tokenizer": str(MODEL)},
    "health": {"interval_s": 0.05},
}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "def f(x):\n    return x\n" * 4}], "max_tokens": 3}
TEXT = {"model": "m", "prompt": "import os\nprint(os.getcwd())\n" * 4, "max_tokens": 3}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def shipped():
    tokenizer = LocalTokenizer.load(MODEL)
    yield tokenizer
    tokenizer.close()


def model_tokenize(tokenizer: LocalTokenizer):
    """A worker's /tokenize with the shipped model's tokenizer and template (a chat it cannot
    render plainly: its JSON's bytes, as the stand-in's own)."""

    def tokenize(body: dict) -> list[int]:
        if "prompt" in body:
            return tokenizer.encode(body["prompt"], body.get("add_special_tokens", True))
        text = tokenizer.chat_text(body)
        return tokenizer.encode(text, False) if text is not None else list(repr(body["messages"]).encode())

    return tokenize


def sources(fleet: Fleet) -> dict[str, float]:
    text = httpx.get(fleet.url + "/metrics").text
    return {s: sample(text, f'pdspec_proxy_prompt_token_ids_total{{source="{s}"}}') for s in ("proxy", "worker")}


def agrees(fleet: Fleet) -> dict[str, float | None]:
    text = httpx.get(fleet.url + "/metrics").text
    return {kind: sample(text, f'pdspec_proxy_tokenizer_agrees{{kind="{kind}"}}') for kind in ("text", "chat")}


def post(fleet: Fleet, path: str, body: dict) -> None:
    response = httpx.post(fleet.url + path, json=body, timeout=10)
    assert response.status_code == 200, response.text


def checked(fleet: Fleet):
    agreement = fleet.app.state.kv_router.tokenizer_check.agreement
    assert wait_for(agreement.known, timeout_s=10), "the tokenizer check never finished"
    return agreement


def test_text_and_plain_chats_are_tokenized_in_the_proxy_once_the_worker_agrees(shipped):
    fleet = Fleet(1, 1, INFO, ROUTING)
    decode = fleet.decodes[0]
    decode.tokenize = model_tokenize(shipped)  # before the first health round starts the check
    with fleet:
        assert sources(fleet) == {"proxy": 0, "worker": 0}  # exported from the start
        agreement = checked(fleet)
        assert (agreement.text, agreement.chat) == (True, True)
        assert agrees(fleet) == {"text": 1, "chat": 1}
        probed = len(decode.tokenized)
        post(fleet, "/v1/completions", TEXT)
        post(fleet, "/v1/chat/completions", CHAT)
        assert len(decode.tokenized) == probed  # no round trip
        assert sources(fleet) == {"proxy": 2, "worker": 0}
        # A chat with tools needs vLLM's own parsing: the worker's /tokenize.
        post(fleet, "/v1/chat/completions", {**CHAT, "tools": TOOLS})
        assert decode.tokenized[-1]["tools"] == TOOLS
        assert sources(fleet) == {"proxy": 2, "worker": 1}
        # The plan keyed the prompt by the proxy's ids: the decode worker got it noted as its own.
        ids, decode_url = shipped.encode(TEXT["prompt"], True), fleet.servers[1].url
        held = fleet.app.state.kv_router.index.matched_blocks(block_keys(ids, 4), [decode_url])
        assert held == {decode_url: len(ids) // 4}


def test_a_worker_that_tokenizes_otherwise_keeps_the_round_trip(shipped):
    with Fleet(1, 1, INFO, ROUTING) as fleet:  # the stand-in's /tokenize: a prompt's bytes
        agreement = checked(fleet)
        assert (agreement.text, agreement.chat) == (False, False)
        assert agrees(fleet) == {"text": 0, "chat": 0}
        probed = len(fleet.decodes[0].tokenized)
        post(fleet, "/v1/completions", TEXT)
        post(fleet, "/v1/chat/completions", CHAT)
        assert len(fleet.decodes[0].tokenized) == probed + 2
        assert sources(fleet) == {"proxy": 0, "worker": 2}


def test_until_the_check_is_done_the_round_trip_serves(shipped):
    tokenize = model_tokenize(shipped)

    def requests_only(body: dict) -> list[int]:  # the probes go unanswered (500)
        if body.get("prompt") != TEXT["prompt"]:
            raise RuntimeError("a probe")
        return tokenize(body)

    fleet = Fleet(1, 1, INFO, ROUTING)
    decode = fleet.decodes[0]
    decode.tokenize = requests_only
    with fleet:
        assert wait_for(lambda: len(decode.tokenized) >= 2, timeout_s=10)  # asked again after a round
        post(fleet, "/v1/completions", TEXT)
        assert fleet.app.state.kv_router.tokenizer_check.agreement.text is None
        assert agrees(fleet) == {"text": None, "chat": None}  # not checked yet: not exported
        assert sources(fleet) == {"proxy": 0, "worker": 1}
        assert any(body.get("prompt") == TEXT["prompt"] for body in decode.tokenized)  # its round trip


def test_a_tokenizer_that_does_not_load_stops_the_proxy(tmp_path):
    from proxy.routing.local_tokenizer import TokenizerLoadError

    routing = {**ROUTING["routing"], "tokenizer": str(tmp_path / "nothing")}
    with pytest.raises(TokenizerLoadError, match="nothing does not exist"):
        with Fleet(1, 1, INFO, routing=routing):
            pass
