"""proxy/routing/tokens.py against a stand-in worker: a prompt's ids given, from /tokenize,
or from a scale-out render endpoint, and None (never an error) for whatever goes wrong.
The proxy's use of them (route plans) is in test_kv_routing.py; the ids against a real
worker's are in tests/e2e/test_routing_tokens.py and test_render_routing.py."""

import json

import pytest

from proxy.routing.tokens import direct_token_ids, prompt_token_ids, rendered_token_ids, tokenize_body
from proxy.upstream.client import UpstreamClient
from tests.standin import StandinBehaviour, ThreadServer, create_standin

RESPONSES = {
    "model": "m",
    "instructions": "Be brief.",
    "input": "Why is the sky blue?",
    "store": False,
    "stream": False,
}
MESSAGES = {
    "model": "m",
    "system": "Be brief.",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "Why is the sky blue?"}],
}


@pytest.fixture()
def worker():
    behaviour = StandinBehaviour()
    with ThreadServer(create_standin(behaviour)) as server:
        yield server.url, behaviour


async def render(url: str, path: str, body: dict, timeout_s: float = 2.0) -> list[int] | None:
    client = UpstreamClient()
    try:
        return await rendered_token_ids(client, url, path, body, timeout_s, {"X-Test": "1"})
    finally:
        client.close()


# --- given ids and /tokenize -----------------------------------------------------------


def test_a_completions_prompt_of_ids_is_used_as_it_is():
    assert direct_token_ids({"prompt": [5, 6, 7]}, chat=False) == [5, 6, 7]
    assert direct_token_ids({"prompt": [[5, 6], [7]]}, chat=False) is None  # several prompts
    assert direct_token_ids({"prompt": [5, True]}, chat=False) is None
    assert direct_token_ids({"prompt": [5, 6]}, chat=True) is None


def test_tokenize_bodies_carry_what_changes_the_rendered_prompt():
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function"}],
        "add_generation_prompt": False,
        "temperature": 0.5,
    }
    assert tokenize_body(chat, chat=True) == {
        "model": "m",
        "messages": chat["messages"],
        "tools": chat["tools"],
        "add_generation_prompt": False,
    }
    assert tokenize_body({"model": "m", "prompt": ["one"]}, chat=False) == {"model": "m", "prompt": "one"}
    assert tokenize_body({"model": "m", "prompt": ["one", "two"]}, chat=False) is None
    assert tokenize_body({"model": "m"}, chat=True) is None


async def test_a_text_prompt_is_tokenized_by_the_worker(worker):
    url, behaviour = worker
    client = UpstreamClient()
    try:
        ids = await prompt_token_ids(client, url, {"model": "m", "prompt": "abc", "max_tokens": 2}, False, 2.0)
        assert ids == list(b"abc")
        behaviour.tokenize_status = 500
        assert await prompt_token_ids(client, url, {"model": "m", "prompt": "abc"}, False, 2.0) is None
    finally:
        client.close()
    assert behaviour.tokenized[0] == {"model": "m", "prompt": "abc"}


# --- render ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, parts",
    [
        ("/v1/responses/render", RESPONSES, ("instructions", "input")),
        ("/v1/messages/render", MESSAGES, ("system", "messages")),
    ],
)
async def test_render_answers_the_prompts_ids(worker, path, body, parts):
    url, behaviour = worker
    ids = await render(url, path, body)
    assert ids == list(json.dumps([body[part] for part in parts]).encode())
    assert behaviour.rendered == [(path, body)]  # the body as given: the caller shapes it (Api.render_body)
    assert ids is not None and all(type(t) is int for t in ids)


async def test_render_sends_the_worker_headers():
    seen: list[dict] = []
    behaviour = StandinBehaviour()
    app = create_standin(behaviour)

    @app.middleware("http")
    async def record(request, call_next):
        seen.append(dict(request.headers))
        return await call_next(request)

    with ThreadServer(app) as server:
        assert await render(server.url, "/v1/responses/render", RESPONSES) is not None
    assert seen[0]["x-test"] == "1" and seen[0]["content-type"] == "application/json"


async def test_a_worker_without_the_scale_out_api_gives_no_ids(worker):
    url, behaviour = worker
    behaviour.scale_out = False  # vLLM's 403 without --enable-scale-out
    assert await render(url, "/v1/responses/render", RESPONSES) is None
    assert await render(url, "/v1/messages/render", MESSAGES) is None
    assert len(behaviour.rendered) == 2  # it was asked, and said no


@pytest.mark.parametrize("status", [400, 404, 500, 503])
async def test_a_worker_error_gives_no_ids(worker, status):
    url, behaviour = worker
    behaviour.render_status = status  # 404: a vLLM without the endpoint; 400: a body it refuses
    assert await render(url, "/v1/responses/render", RESPONSES) is None


async def test_an_unknown_path_gives_no_ids(worker):
    url, _ = worker
    assert await render(url, "/v1/nothing/render", RESPONSES) is None  # the stand-in's own 404


async def test_a_slow_render_gives_no_ids_within_the_timeout(worker):
    import time

    url, behaviour = worker
    behaviour.render_delay_s = 2.0
    started = time.monotonic()
    assert await render(url, "/v1/responses/render", RESPONSES, timeout_s=0.2) is None
    assert time.monotonic() - started < 1.5


async def test_a_dead_worker_gives_no_ids():
    from tests.standin import free_port

    assert await render(f"http://127.0.0.1:{free_port()}", "/v1/responses/render", RESPONSES, 0.5) is None


@pytest.mark.parametrize(
    "reply",
    [
        b"not json",
        b"[1, 2, 3]",  # JSON, not an object
        b"{}",  # no token_ids
        b'{"token_ids": null}',
        b'{"token_ids": "1 2 3"}',
        b'{"token_ids": [1, "2", 3]}',
        b'{"token_ids": [1, 2.0, 3]}',
        b'{"token_ids": [1, true, 3]}',
        b'{"token_ids": [[1, 2]]}',
        b'{"tokens": [1, 2, 3]}',  # /tokenize's key, not render's
    ],
)
async def test_an_odd_reply_gives_no_ids(worker, reply):
    url, behaviour = worker
    behaviour.render_reply = reply
    assert await render(url, "/v1/messages/render", MESSAGES) is None


async def test_a_good_reply_of_the_same_shape_gives_its_ids(worker):
    # The counterpart of the odd replies: the same path with well-formed ids is read.
    url, behaviour = worker
    behaviour.render_reply = b'{"request_id": "r", "token_ids": [7, 8, 9], "sampling_params": {}}'
    assert await render(url, "/v1/messages/render", MESSAGES) == [7, 8, 9]
