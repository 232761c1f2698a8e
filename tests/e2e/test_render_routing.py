"""Cache-aware routing of Responses and Messages requests with real workers (2 prefill,
1 decode, vLLM's KV events, KV over NIXL, the scale-out API on by default): the proxy
reads their token ids from the decode worker's `/v1/responses/render` and
`/v1/messages/render` (proxy/routing/tokens.py), so a request whose long `instructions`
(or `system`) a prefill worker holds lands on it, as that worker's own prefix-cache
counter shows.

The context is put in a prefill worker's cache by a chat sent to that worker directly,
never through the proxy, and on the worker the proxy's rendezvous hash of the request
would NOT pick: only the worker's KV events (keyed on the ids a chat renders) can lead
the proxy there, and only if render gives the same ids for the Responses or Messages
request. Without render's ids the request goes where the hash says, the other worker."""

import httpx
import pytest

from proxy.routing.keys import rendezvous
from proxy.routing.kv_index import block_keys
from proxy.routing.kv_router import new_part_key
from tests import harness
from tests.e2e.test_kv_routing import index_blocks, prefix_hits, wait_for

pytestmark = pytest.mark.after_stack  # three workers: not beside the shared stack

BASE = 23000  # this module's proxy; the workers are the shared fleet's (tests/fleet.py)
MODEL = "pdspec-tiny"
# About 720 tokens each with the local tokenizer: 5 KV blocks of 128 on the CPU. Two
# contexts, one per API, so neither request finds the other's blocks.
INSTRUCTIONS = "You review code. The module under review:\n" + "".join(
    f"def helper_{i}(value):\n    return value * {i} + {i % 7}\n\n" for i in range(40)
)
SYSTEM = "You answer questions about this table:\n" + "".join(
    f"| row {i} | {i * 3} apples | {i % 5} pears |\n" for i in range(60)
)
QUESTIONS = [
    "What does helper_3 return?",
    "Which entry is the largest?",
    "Rewrite the third one.",
    "Is the last one pure?",
]
ROUTING = {
    "routing": {
        "prefill_policy": "kv_aware",
        "decode_policy": "kv_aware",
        # A render of ~750 tokens on two busy cores can take longer than the default 0.5 s.
        "tokenize_timeout_s": 10,
    },
    "observability": {"served_by_headers": True},
}


@pytest.fixture(scope="module")
def fleet(fleet_2p1d):
    """The shared 2P1D fleet (tests/fleet.py) behind a kv_aware proxy of this module's own."""
    proxy = harness.start_proxy(
        BASE,
        prefill_urls=fleet_2p1d.prefill_urls,
        decode_urls=fleet_2p1d.decode_urls,
        **ROUTING,
        health={"interval_s": 0.5},
        kv_transfer={"source_ports": fleet_2p1d.kv_source_ports},
        worker_client={"prefill_timeout_s": 60, "decode_timeout_s": 120},
    )
    try:
        harness.wait_healthy(proxy.url, proxy.process, path="/ready")
        yield {**fleet_2p1d.servers, "proxy": proxy}
    finally:
        proxy.stop()


def chat_ids(client: httpx.Client, worker: str, system: str, user: str | list) -> list[int]:
    """What /tokenize gives for the chat a Responses or Messages request stands for."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    response = client.post(
        worker + "/tokenize", json={"model": MODEL, "messages": messages, "add_generation_prompt": True}
    )
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def render(client: httpx.Client, worker: str, path: str, body: dict) -> list[int]:
    response = client.post(worker + path, json=body)
    assert response.status_code == 200, response.text
    return response.json()["token_ids"]


def responses_body(question: str) -> dict:
    return {"model": MODEL, "instructions": INSTRUCTIONS, "input": question, "max_output_tokens": 4, "temperature": 0}


def messages_body(question: str) -> dict:
    return {
        "model": MODEL,
        "system": SYSTEM,
        "max_tokens": 4,
        "temperature": 0,
        "messages": [{"role": "user", "content": question}],
    }


def test_render_gives_the_ids_of_the_equivalent_chat(fleet):
    """The ids routing keys a Responses or Messages prompt by are the chat's: a worker's
    events for a chat with the same system prompt match them block for block."""
    decode = fleet["d"].url
    with httpx.Client(timeout=60) as client:
        for question in QUESTIONS[:2]:
            expected = chat_ids(client, decode, INSTRUCTIONS, question)
            assert render(client, decode, "/v1/responses/render", responses_body(question)) == expected
            expected = chat_ids(client, decode, SYSTEM, question)
            assert render(client, decode, "/v1/messages/render", messages_body(question)) == expected
        # Input items and content blocks render as their plain-text forms do.
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTIONS[0]}]}
        items = {**responses_body("x"), "input": [item]}
        assert render(client, decode, "/v1/responses/render", items) == chat_ids(
            client, decode, INSTRUCTIONS, QUESTIONS[0]
        )
        blocks = {
            **messages_body("x"),
            "system": [{"type": "text", "text": SYSTEM}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTIONS[0]}]}],
        }
        assert render(client, decode, "/v1/messages/render", blocks) == chat_ids(client, decode, SYSTEM, QUESTIONS[0])
        # The proxy itself serves none of the scale-out endpoints.
        assert client.post(fleet["proxy"].url + "/v1/responses/render", json=responses_body("x")).status_code == 404


def block_size(worker: str) -> int:
    (labels,) = harness.scrape_labeled(worker, "pdspec_worker_info")
    return int(dict(labels)["block_size"])


def decisions(proxy: str) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["pool"], dict(labels)["reason"]): value
        for labels, value in harness.scrape_labeled(proxy, "pdspec_proxy_routing_decisions_total").items()
    }


def warm_where_the_hash_would_not_go(fleet, client: httpx.Client, ids: list[int], system: str) -> tuple[str, str]:
    """Puts `system` in the cache of the prefill worker that the proxy's rendezvous hash of
    `ids` ranks last (its key with nothing cached), with a chat sent to it directly; waits until the proxy's index has
    that worker's blocks. Returns (holder, other)."""
    prefills = [fleet["p1"].url, fleet["p2"].url]
    size = block_size(prefills[0])
    key = new_part_key(ids, block_keys(ids, size), size)
    holder = min(prefills, key=lambda url: rendezvous(key, url))
    other = next(url for url in prefills if url != holder)
    before = index_blocks(fleet["proxy"].url).get(holder, 0)
    warm = client.post(
        holder + "/v1/chat/completions",
        json={
            "model": MODEL,
            "max_tokens": 1,
            "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello."}],
        },
    )
    assert warm.status_code == 200, warm.text
    wait_for(lambda: index_blocks(fleet["proxy"].url).get(holder, 0) > before, "the warmed worker's KV events", 60)
    return holder, other


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_shared_context_lands_on_the_prefill_worker_that_holds_it(fleet, api):
    proxy, decode = fleet["proxy"].url, fleet["d"].url
    path, body_of, context = (
        ("/v1/responses", responses_body, INSTRUCTIONS)
        if api == "responses"
        else ("/v1/messages", messages_body, SYSTEM)
    )
    with httpx.Client(timeout=180) as client:
        ids = render(client, decode, f"{path}/render", body_of(QUESTIONS[1]))
        holder, other = warm_where_the_hash_would_not_go(fleet, client, ids, context)
        # The prompt's part that the warm-up chat shares (its system turn) in whole blocks,
        # less one: with an EAGLE drafter vLLM gives up the last block of every hit.
        shared = chat_ids(client, decode, context, "Hello.")
        common = next(i for i, (a, b) in enumerate(zip(ids, shared)) if a != b)
        size = block_size(holder)
        expected_hits = (common // size - 1) * size
        assert expected_hits >= 3 * size  # a long context, or the test proves little
        hits = {url: prefix_hits(url) for url in (holder, other)}
        before = decisions(proxy)
        served = []
        for question in QUESTIONS[1:]:
            response = client.post(proxy + path, json=body_of(question))
            assert response.status_code == 200, response.text
            served.append(response.headers["x-pdspec-prefill-worker"])
        assert served == [holder] * 3
        assert prefix_hits(holder) - hits[holder] >= 3 * expected_hits  # the context hit, each time
        assert prefix_hits(other) == hits[other]
        after = decisions(proxy)
        assert after.get(("prefill", "cache_hit"), 0) - before.get(("prefill", "cache_hit"), 0) == 3
        assert after.get(("any", "no_token_ids"), 0) == before.get(("any", "no_token_ids"), 0)
