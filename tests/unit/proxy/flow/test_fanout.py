"""proxy/flow/fanout.py: splitting a request into its choices and merging the replies."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from proxy.asgi import Reply
from proxy.flow.fanout import (
    _QUEUED_EVENTS,
    choice_count,
    merge_streams,
    merge_usage,
    merge_whole,
    prompts_of,
    split,
    wrap_int64,
)


def test_a_list_of_prompts_splits_prompt_by_prompt_then_choice_by_choice():
    body = {"model": "m", "prompt": ["a", "b", "c"], "n": 2, "seed": 7}
    parts = split(body, 2)
    assert [(p["prompt"], p["seed"]) for p in parts] == [("a", 7), ("a", 8), ("b", 7), ("b", 8), ("c", 7), ("c", 8)]
    assert all(p["n"] == 1 for p in parts)
    assert choice_count(body) == 6


@pytest.mark.parametrize(
    "prompt, prompts",
    [
        ("one prompt", None),
        ([1, 2, 3], None),  # one prompt of token ids
        (["a", "b"], ["a", "b"]),
        ([[1, 2], [3]], [[1, 2], [3]]),
        (["only"], ["only"]),
    ],
)
def test_what_counts_as_a_list_of_prompts(prompt, prompts):
    assert prompts_of({"prompt": prompt}) == prompts


def test_token_id_prompts_split_too():
    parts = split({"prompt": [[1, 2], [3, 4, 5]]}, 1)
    assert [p["prompt"] for p in parts] == [[1, 2], [3, 4, 5]]


@pytest.mark.parametrize("seed", [2**63 - 1, 2**63 - 2, -(2**63), 0, -1, 12345])
def test_a_wrapped_seed_seeds_torch_as_vllms_own_seed_does(seed):
    """vLLM's choice j runs with `seed + j`, unbounded; the API takes int64 only. torch
    reads a negative seed's two's-complement bits, so the wrapped seed is the same
    generator: the same random stream as vLLM's own n > 1."""
    for j in range(4):
        wrapped = wrap_int64(seed + j)
        assert -(2**63) <= wrapped <= 2**63 - 1
        own = torch.Generator().manual_seed(seed + j)
        ours = torch.Generator().manual_seed(wrapped)
        assert torch.equal(torch.rand(8, generator=own), torch.rand(8, generator=ours))


def test_the_largest_seed_with_n_stays_in_range():
    parts = split({"prompt": "x", "seed": 2**63 - 1}, 3)
    assert [p["seed"] for p in parts] == [2**63 - 1, -(2**63), -(2**63) + 1]


def test_usage_counts_each_prompt_once_and_sums_the_completions():
    def usage(prompt, completion, cached):
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    # two prompts (5 and 7 tokens) x n=2
    merged = merge_usage([usage(5, 3, 0), usage(5, 4, 5), usage(7, 2, 0), usage(7, 1, 7)], n=2)
    assert merged["prompt_tokens"] == 12
    assert merged["completion_tokens"] == 10
    assert merged["total_tokens"] == 22
    assert merged["prompt_tokens_details"]["cached_tokens"] == 0  # the first choice of each prompt


def test_whole_replies_are_indexed_as_vllm_indexes_them():
    bodies = [json.dumps({"id": "x", "choices": [{"index": 0, "text": t}]}).encode() for t in "abcd"]
    merged = json.loads(merge_whole(bodies, n=2))
    assert [(c["index"], c["text"]) for c in merged["choices"]] == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]


async def test_a_client_that_reads_nothing_holds_a_bounded_merge():
    """Each choice's reader stops once the merge holds _QUEUED_EVENTS events, so it stops
    reading its worker: memory stays bounded for a client that reads nothing."""
    produced = [0, 0]

    async def events(index: int):
        for _ in range(10_000):
            produced[index] += 1
            yield b'data: {"choices": [{"index": 0, "text": "t"}]}\n\n'
        yield b"data: [DONE]\n\n"

    replies = [Reply(200, stream=events(i)) for i in range(2)]
    merged = merge_streams(replies, include_usage=False, n=2)
    first = await merged.__anext__()
    assert first.startswith(b"data: ")
    for _ in range(50):  # give the readers every chance to run ahead
        await asyncio.sleep(0)
    assert sum(produced) <= _QUEUED_EVENTS + 4
    await merged.aclose()


@pytest.mark.parametrize("continuous", [False, True])
async def test_continuous_usage_stays_on_every_chunk(continuous):
    """With `continuous_usage_stats` every chunk keeps its own choice's usage, as vLLM's
    chunks do (the merge once cleared it from all but the closing usage chunk)."""

    async def events(index: int):
        for done in (1, 2):
            usage = {"prompt_tokens": 3, "completion_tokens": done, "total_tokens": 3 + done}
            yield b"data: " + json.dumps({"choices": [{"index": 0, "text": "t"}], "usage": usage}).encode() + b"\n\n"
        closing = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
        yield b"data: " + json.dumps(closing).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    replies = [Reply(200, stream=events(i)) for i in range(2)]
    chunks = [
        json.loads(event[6:])
        async for event in merge_streams(replies, True, 2, continuous)
        if event != b"data: [DONE]\n\n"
    ]
    with_choices = [c for c in chunks if c["choices"]]
    assert len(with_choices) == 4
    if continuous:
        assert all(c["usage"]["prompt_tokens"] == 3 for c in with_choices)
        assert sorted(c["usage"]["completion_tokens"] for c in with_choices) == [1, 1, 2, 2]
    else:
        assert all(c["usage"] is None for c in with_choices)
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
