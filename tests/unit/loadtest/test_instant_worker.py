"""The benchmarks' instant worker: its replies by kind, and its replies as pdspec's proxy
takes them (a real proxy in front of two instant workers, over real sockets)."""

import json

import httpx

from loadtest.micro.instant_worker import KINDS, InstantWorker, content_length, stream_reply, token_ids
from loadtest.micro.proxy_race import check_reply
from pdspec.settings import ProxySettings
from proxy.app import create_app
from proxy.fleet.worker_info import parse_worker_info
from tests.harness import wait_for
from tests.standin import InstantWorkerThread, ThreadServer

PREFILL_LEG = json.dumps(
    {"prompt": "a b", "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
).encode()


def unchunked(pieces: tuple[bytes, ...]) -> tuple[bytes, bytes]:
    """A chunked reply's head and its body put back together (the chunks checked on the way)."""
    raw = b"".join(pieces)
    head, _, rest = raw.partition(b"\r\n\r\n")
    body = b""
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        assert rest[size : size + 2] == b"\r\n"
        body += rest[:size]
        rest = rest[size + 2 :]
        if size == 0:
            assert rest == b""
            return head, body


def body_of(pieces: tuple[bytes, ...]) -> bytes:
    head, _, body = b"".join(pieces).partition(b"\r\n\r\n")
    assert content_length(head.partition(b"\r\n")[2]) == len(body)
    return body


def test_a_prefill_leg_gets_kv_transfer_params_and_a_decode_leg_the_text():
    worker = InstantWorker()
    prefill = json.loads(body_of(worker.reply(b"POST", b"/v1/completions", PREFILL_LEG)))
    assert prefill["kv_transfer_params"]["remote_port"] == 5600
    spaced = b'{"kv_transfer_params": {"do_remote_decode" : true}}'
    assert worker.kind(b"POST", b"/v1/completions", spaced) == "prefill"
    decode = json.loads(body_of(worker.reply(b"POST", b"/v1/completions", b'{"prompt": "a", "stream": false}')))
    assert decode["choices"][0]["text"] == " hello world"
    assert worker.counts["prefill"] == 1 and worker.counts["decode"] == 1


def test_a_streamed_decode_is_chunked_events_one_write_each_then_done():
    worker = InstantWorker(stream_tokens=64)
    pieces = worker.reply(b"POST", b"/v1/completions", b'{"prompt": "a", "stream": true}')
    assert len(pieces) == 1 + 64 + 1  # the head, an event a write, [DONE] with the last chunk
    head, body = unchunked(pieces)
    assert b"transfer-encoding: chunked" in head and b"text/event-stream" in head
    assert check_reply(200, body, streamed=True, stream_tokens=64) is None
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    assert [e["choices"][0]["finish_reason"] for e in events] == [None] * 63 + ["length"]
    assert worker.counts["decode_stream"] == 1
    assert unchunked(stream_reply(3))[1].count(b"data: ") == 4


def test_tokenize_gives_a_token_per_word_the_same_in_every_worker():
    body = json.dumps({"model": "bench", "prompt": "the cat  saw the\ndog"}).encode()
    first = json.loads(body_of(InstantWorker().reply(b"POST", b"/tokenize", body)))
    again = json.loads(body_of(InstantWorker().reply(b"POST", b"/tokenize", body)))
    assert first == again and first["count"] == 5 == len(first["tokens"])
    assert first["tokens"][0] == first["tokens"][3] != first["tokens"][1]  # "the" twice
    chat = json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "the cat"}]}]}).encode()
    assert json.loads(body_of(InstantWorker().reply(b"POST", b"/tokenize", chat)))["tokens"] == token_ids("the cat")


def test_render_answers_vllms_list_of_generate_requests_with_the_same_ids():
    worker = InstantWorker()
    body = json.dumps({"model": "bench", "prompt": "the cat sat", "max_tokens": 7, "stream": True}).encode()
    (rendered,) = json.loads(body_of(worker.reply(b"POST", b"/v1/completions/render", body)))
    assert rendered["token_ids"] == token_ids("the cat sat") and len(rendered["token_ids"]) == 3
    assert rendered["sampling_params"]["max_tokens"] == 7 and rendered["stream"] is True
    ids = json.loads(body_of(worker.reply(b"POST", b"/v1/completions/render", b'{"prompt": [5, 6]}')))
    assert ids[0]["token_ids"] == [5, 6]
    assert worker.counts["render"] == 2


def test_metrics_report_the_block_size_as_pdspec_reads_it_and_stats_count_every_kind():
    worker = InstantWorker(block_size=32)
    info = parse_worker_info(body_of(worker.reply(b"GET", b"/metrics", b"")).decode())
    assert info is not None and info["block_size"] == "32" and info["model"] == "bench"
    worker.reply(b"GET", b"/health", b"")
    stats = json.loads(body_of(worker.reply(b"GET", b"/stats", b"")))
    assert set(stats) == set(KINDS)
    assert stats["metrics"] == 1 and stats["other"] == 1 and stats["stats"] == 1


def test_pdspecs_proxy_relays_both_shapes_and_kv_aware_tokenizes_on_the_decode_worker():
    prefill, decode = InstantWorker(stream_tokens=64), InstantWorker(stream_tokens=64)
    with InstantWorkerThread(prefill) as p, InstantWorkerThread(decode) as d:
        settings = ProxySettings(
            prefill_urls=[p.url],
            decode_urls=[d.url],
            routing={"prefill_policy": "kv_aware", "decode_policy": "kv_aware"},
        )
        with ThreadServer(create_app(settings)) as proxy, httpx.Client(base_url=proxy.url, timeout=10) as client:
            assert wait_for(lambda: client.get("/ready").status_code == 200, timeout_s=15)
            for streamed in (False, True, False, True):
                body = {
                    "model": "bench",
                    "prompt": "the cat sat on the mat " * 20,
                    "max_tokens": 64,
                    "stream": streamed,
                }
                reply = client.post("/v1/completions", json=body)
                assert check_reply(reply.status_code, reply.content, streamed, 64) is None
    assert prefill.counts["prefill"] == 4
    assert decode.counts["decode"] == 2 and decode.counts["decode_stream"] == 2
    # kv_aware read the block size from /metrics, so it asked for each prompt's ids.
    assert decode.counts["tokenize"] == 4


def test_with_a_tokenizer_tokenize_answers_its_ids(tmp_path):
    """--tokenizer: a text prompt's ids are the tokenizer's, with or without special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from loadtest.micro import instant_worker

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "[BOS]": 1, "hello": 2, "world": 3}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 1)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    instant_worker.use_tokenizer(str(tmp_path))
    try:
        with_bos = json.loads(instant_worker.tokenize_reply(b'{"prompt": "hello world there"}'))
        without = json.loads(
            instant_worker.tokenize_reply(b'{"prompt": "hello world there", "add_special_tokens": false}')
        )
    finally:
        instant_worker.use_tokenizer(None)
    assert with_bos["tokens"] == [1, 2, 3, 0] and without["tokens"] == [2, 3, 0]
    assert json.loads(instant_worker.tokenize_reply(b'{"prompt": "hello world"}'))["count"] == 2  # words again
