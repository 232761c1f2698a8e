"""The benchmarks' client: what it reads of a reply beyond its tokens (the proxy's
Server-Timing and served-by headers)."""

import asyncio

import httpx

from loadtest.serving.serve_client import completion_body, server_timing, stream_completion
from tests.proxy_cluster import PAIRED_INFO as INFO
from tests.proxy_cluster import Fleet


def test_server_timing_reads_durations_and_skips_what_has_none():
    assert server_timing("route;dur=1.5, prefill;dur=250, decode;dur=3") == {
        "route": 1.5,
        "prefill": 250.0,
        "decode": 3.0,
    }
    assert server_timing('cache;desc="hit", db;dur="53.2"') == {"db": 53.2}
    assert server_timing("x;dur=abc, y") == {} and server_timing(None) == {}


def test_a_streamed_completion_keeps_the_proxys_phases_and_workers():
    async def one(url: str):
        async with httpx.AsyncClient(timeout=30) as client:
            return await stream_completion(client, url, completion_body("m", list(range(10, 60)), 3))

    with Fleet(1, 1, INFO, observability={"served_by_headers": True}) as fleet:
        fleet.prefills[0].delay_s = 0.2
        result = asyncio.run(one(fleet.url))
        assert result.ok, result.error
        assert set(result.phases_ms) == {"route", "prefill", "decode"} and result.phases_ms["prefill"] >= 200
        assert result.ttft_s * 1000 >= sum(result.phases_ms.values())
        assert result.served_by == {"prefill": fleet.servers[0].url, "decode": fleet.servers[1].url}
    with Fleet(1, 1, INFO) as fleet:  # off: nothing to read
        result = asyncio.run(one(fleet.url))
        assert result.ok and result.phases_ms == {} and result.served_by == {}


# --- vLLM's prefix-repetition prompts ---------------------------------------------------------

PREFIX_LEN, SUFFIX_LEN, NUM_PREFIXES, COUNT = 48, 12, 3, 9


def prefix_prompts(seed: int, server=None) -> list[str]:
    from loadtest.serving.serve_client import vllm_prefix_repetition_prompts
    from pdspec.models.build import install_models
    from tests.harness import models_dir

    install_models(models_dir())  # a no-op once installed (`make test` does it first)
    return vllm_prefix_repetition_prompts(
        COUNT, PREFIX_LEN, SUFFIX_LEN, NUM_PREFIXES, models_dir() / "target", seed, server=server
    )


def test_prefix_repetition_prompts_are_vllms_dataset_in_its_order():
    """Differential: the texts and the order of vLLM's own PrefixRepetitionRandomDataset,
    as `vllm bench serve --dataset-name prefix_repetition --seed S` builds it."""
    from vllm.benchmarks.datasets import PrefixRepetitionRandomDataset
    from vllm.tokenizers import get_tokenizer

    from tests.harness import models_dir

    ours = prefix_prompts(5)
    samples = PrefixRepetitionRandomDataset(random_seed=5).sample(
        tokenizer=get_tokenizer(str(models_dir() / "target")),
        num_requests=COUNT,
        prefix_len=PREFIX_LEN,
        suffix_len=SUFFIX_LEN,
        num_prefixes=NUM_PREFIXES,
        output_len=7,
    )
    assert ours == [s.prompt for s in samples] and len(ours) == COUNT
    assert prefix_prompts(6) != ours


def test_prefix_repetition_tenants_share_their_prefix():
    """Each of the prefixes opens COUNT / NUM_PREFIXES prompts, whose suffixes differ (the
    first tokens of the prefix compared: the last may merge with the suffix's text)."""
    from transformers import AutoTokenizer

    from tests.harness import models_dir

    tokenizer = AutoTokenizer.from_pretrained(models_dir() / "target")
    prompts = prefix_prompts(5)
    tokens = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    groups: dict[tuple, list[tuple]] = {}
    for ids in tokens:
        groups.setdefault(tuple(ids[: PREFIX_LEN - 4]), []).append(tuple(ids[PREFIX_LEN + 4 :]))
    assert len(groups) == NUM_PREFIXES
    assert all(len(suffixes) == COUNT // NUM_PREFIXES == len(set(suffixes)) for suffixes in groups.values())
    # Shuffled, as vLLM sends them: not each tenant's prompts one after another (that
    # order changes tenant NUM_PREFIXES - 1 times).
    keys = [tuple(ids[: PREFIX_LEN - 4]) for ids in tokens]
    assert sum(a != b for a, b in zip(keys, keys[1:])) > NUM_PREFIXES - 1


def test_prefix_repetition_needs_a_multiple_of_the_prefixes():
    import pytest

    from loadtest.serving.serve_client import vllm_prefix_repetition_prompts

    with pytest.raises(ValueError, match="multiple"):
        vllm_prefix_repetition_prompts(10, 8, 4, 3, "unused", 0)


def test_prefix_repetition_prompts_are_aligned_to_the_server_as_vllms_tool_does():
    """Given the server, vLLM's own alignment runs: a server whose /tokenize counts the first
    prompt longer than the sampler did has every longer prompt cut back through its
    /detokenize (here a marker text); a server without /tokenize leaves the texts alone."""
    from fastapi import FastAPI, Request

    from tests.standin import ThreadServer

    app = FastAPI()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        return {"tokens": list(range(PREFIX_LEN + SUFFIX_LEN + len(body["prompt"]) % 3 + 1))}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await request.json()
        return {"prompt": f"cut to {len(body['tokens'])}"}

    with ThreadServer(app) as server:
        aligned = prefix_prompts(5, server=(server.url, "m"))
    assert aligned == [f"cut to {PREFIX_LEN + SUFFIX_LEN}"] * COUNT
    with ThreadServer(FastAPI()) as server:
        assert prefix_prompts(5, server=(server.url, "m")) == prefix_prompts(5)
