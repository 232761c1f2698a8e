"""cached_tokens in the client's usage comes from the prefill leg."""

import json

from proxy.apis.usage import cached_tokens_of, patch_body, patch_stream

USAGE = {
    "prompt_tokens": 40,
    "completion_tokens": 5,
    "total_tokens": 45,
    "prompt_tokens_details": {"cached_tokens": 32},
}


def test_prefill_reply_gives_its_cached_tokens():
    assert cached_tokens_of({"usage": USAGE}) == 32
    assert cached_tokens_of({"usage": {"prompt_tokens": 3}}) is None
    assert cached_tokens_of({}) is None


def test_whole_reply_gets_the_prefill_number():
    body = json.dumps({"choices": [], "usage": USAGE}).encode()
    patched = json.loads(patch_body(body, 16))
    assert patched["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    assert patched["usage"]["prompt_tokens"] == 40
    assert patch_body(body, None) == body  # decode-only fallback: the decode worker's own number


def test_reply_without_details_is_untouched():
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 3}}).encode()
    assert patch_body(body, 16) == body


async def chunks(*parts):
    for part in parts:
        yield part


async def collect(stream):
    return b"".join([chunk async for chunk in stream])


async def test_stream_usage_chunk_is_patched_even_when_split_across_reads():
    usage_event = b"data: " + json.dumps({"choices": [], "usage": USAGE}).encode() + b"\n\n"
    token_event = b'data: {"choices":[{"text":"a"}]}\n\n'
    stream = token_event + usage_event + b"data: [DONE]\n\n"
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    out = await collect(patch_stream(chunks(*pieces), 8))
    events = [e for e in out.split(b"\n\n") if e]
    assert events[0] == token_event.strip()
    assert json.loads(events[1][6:])["usage"]["prompt_tokens_details"]["cached_tokens"] == 8
    assert events[2] == b"data: [DONE]"


async def test_stream_passes_through_untouched_without_a_number():
    stream = [b'data: {"usage": {"prompt_tokens_details": {"cached_tokens": 39}}}\n\n', b"data: [DONE]\n\n"]
    assert await collect(patch_stream(chunks(*stream), None)) == b"".join(stream)
