"""The load generator of serve_bench: random prompts, streamed completions.

Prompts are lists of token ids (the proxy and vLLM take them as `prompt` on
/v1/completions) drawn uniformly, or the texts of vLLM's own random dataset; fresh for
every phase, so no prefix-cache hit makes a phase cheaper. Or the texts of vLLM's
prefix-repetition dataset (tenants sharing a long prefix), where prefix-cache hits are the
point.
`ignore_eos` keeps every reply at `max_tokens`, whatever the weights.

Arrivals at a request rate: serve_bench's own Poisson draw (`random.expovariate`, seeded
by the phase), or, after one of the vllm_* prompt functions, the instants `vllm bench
serve` sends at for the same seed, dataset and rate (`vllm_send_offsets`).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from loadtest.serving.serve_stats import RequestResult

# Low ids are often control or byte tokens; the benchmark needs none of them.
FIRST_TOKEN_ID = 10


def random_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(FIRST_TOKEN_ID, vocab_size, size=(count, length)).tolist()


def vllm_random_prompts(count: int, length: int, tokenizer_path: str | Path, seed: int) -> list[str]:
    """The prompts `vllm bench serve --dataset-name random --seed SEED` sends: vLLM's own
    RandomDataset sampler (runs of consecutive token ids from a random offset, decoded,
    then re-encoded to `length` tokens), the same texts for the same seed and tokenizer.
    Seeds `random` and numpy's global state as vLLM's tool does first (its main), so that
    `vllm_send_offsets` right after gives its arrival instants."""
    from vllm.benchmarks.datasets import RandomDataset
    from vllm.tokenizers import get_tokenizer

    seed_as_vllm_bench(seed)
    tokenizer = get_tokenizer(str(tokenizer_path))
    samples = RandomDataset(random_seed=seed).sample(
        tokenizer=tokenizer, num_requests=count, input_len=length, output_len=1, range_ratio=0.0, prefix_len=0
    )
    return [sample.prompt for sample in samples]


def vllm_prefix_repetition_prompts(
    count: int,
    prefix_len: int,
    suffix_len: int,
    num_prefixes: int,
    tokenizer_path: str | Path,
    seed: int,
    server: tuple[str, str] | None = None,
) -> list[str]:
    """The prompts `vllm bench serve --dataset-name prefix_repetition --seed SEED` sends, in
    its order: vLLM's own PrefixRepetitionRandomDataset sampler (`num_prefixes` prefixes of
    `prefix_len` random token ids, each followed by `count // num_prefixes` suffixes of
    `suffix_len`, decoded to text, then shuffled), the same texts for the same seed and
    tokenizer. `count` must be a multiple of `num_prefixes` (vLLM sends the multiple below
    it; ValueError here rather than fewer prompts than asked).

    `server` (base URL, model): vLLM's tool then re-aligns the texts to the server's
    tokenizer (`_align_prompts_to_server_tokenizer`: when the server counts the first
    prompt's tokens differently from the sampler, each prompt that re-encodes longer is cut
    back through /tokenize and /detokenize); the same function is applied here, so both
    tools send the same texts. A vLLM without that function sends the sampled texts, and so
    does this (a warning on stderr).

    Seeds as vllm_random_prompts does; the sampler draws its token ids from numpy's global
    state, which `vllm_send_offsets` right after goes on from, as vLLM's tool does (the
    alignment draws nothing)."""
    if num_prefixes < 1 or count % num_prefixes:
        raise ValueError(f"{count} prompts over {num_prefixes} prefixes: the count must be a multiple")
    from vllm.benchmarks.datasets import PrefixRepetitionRandomDataset
    from vllm.tokenizers import get_tokenizer

    seed_as_vllm_bench(seed)
    tokenizer = get_tokenizer(str(tokenizer_path))
    samples = PrefixRepetitionRandomDataset(random_seed=seed).sample(
        tokenizer=tokenizer,
        num_requests=count,
        prefix_len=prefix_len,
        suffix_len=suffix_len,
        num_prefixes=num_prefixes,
        output_len=1,
    )
    if server is not None:
        from vllm.benchmarks import serve as vllm_serve

        align = getattr(vllm_serve, "_align_prompts_to_server_tokenizer", None)
        if align is None:
            print(
                "vllm_prefix_repetition_prompts: this vLLM has no prompt alignment; sampled texts sent", file=sys.stderr
            )
        else:
            samples = asyncio.run(align(server[0], server[1], samples))
    return [sample.prompt for sample in samples]


def seed_as_vllm_bench(seed: int) -> None:
    """What `vllm bench serve --seed SEED` does before it loads the tokenizer and samples its
    dataset (`main_async`): Python's and numpy's global generators seeded."""
    random.seed(seed)
    np.random.seed(seed)


def vllm_send_offsets(count: int, request_rate: float, burstiness: float = 1.0) -> list[float]:
    """The instants, in seconds from the start of the run, at which `vllm bench serve
    --request-rate RATE` sends its `count` requests (`get_request` without ramp-up), drawn
    from numpy's global state as it stands: one gamma(burstiness, 1 / (rate x burstiness))
    gap per request (burstiness 1: Poisson), cumulated, then scaled so that the last is
    count / rate; the first request waits its own gap too.

    Contract: called right after vllm_random_prompts or vllm_prefix_repetition_prompts for
    the same count and seed, the global state is the one vLLM's tool draws from, so these
    are its instants for that seed, dataset and rate (to float rounding: the same sums).
    Advances numpy's global state by `count` gamma draws. A rate or burstiness that is not
    positive and finite is a ValueError (vLLM's infinite rate sends all at once: no
    schedule to match)."""
    if count < 1:
        raise ValueError(f"{count} requests: nothing to schedule")
    if not (0 < request_rate < float("inf") and 0 < burstiness < float("inf")):
        raise ValueError(f"request rate {request_rate}, burstiness {burstiness}: both must be positive and finite")
    theta = 1.0 / (request_rate * burstiness)
    offsets = [np.random.gamma(shape=burstiness, scale=theta) for _ in range(count)]
    for i in range(1, count):
        offsets[i] += offsets[i - 1]  # summed in vLLM's order, so rounded as its sums are
    if offsets[-1] == 0:
        return offsets
    factor = (count / request_rate) / offsets[-1]
    return [float(offset * factor) for offset in offsets]


def completion_body(model: str, prompt: list[int] | str, max_tokens: int) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_completion(client: httpx.AsyncClient, url: str, body: dict) -> RequestResult:
    """One streamed completion, timed chunk by chunk."""
    prompt = body["prompt"]
    prompt_tokens = len(prompt) if isinstance(prompt, list) else 0  # text: the server's usage counts it
    started = time.perf_counter()
    ttft, last, gaps, usage, finished = None, 0.0, [], None, False
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return RequestResult(False, prompt_tokens, error=f"HTTP {response.status_code}: {text[:200]}")
            phases, served_by = server_timing(response.headers.get("server-timing")), served_by_of(response.headers)
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    # Read on to the end of the body: leaving now would close the
                    # connection under a reply the server has not finished, which the
                    # proxy counts as a client gone away (499).
                    finished = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    return RequestResult(False, prompt_tokens, error=f"error event: {chunk['error']}"[:240])
                if chunk.get("choices"):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - started
                    else:
                        gaps.append(now - last)
                    last = now
                usage = chunk.get("usage") or usage
    except (httpx.HTTPError, ValueError) as exc:
        return RequestResult(False, prompt_tokens, error=f"{type(exc).__name__}: {exc}"[:240])
    e2e = time.perf_counter() - started
    if not finished or ttft is None:
        return RequestResult(False, prompt_tokens, error="stream ended without a choice or [DONE]")
    output_tokens = (usage or {}).get("completion_tokens") or len(gaps) + 1
    return RequestResult(
        True,
        (usage or {}).get("prompt_tokens") or prompt_tokens,
        output_tokens,
        ttft,
        e2e,
        gaps,
        phases_ms=phases,
        served_by=served_by,
    )


def server_timing(header: str | None) -> dict[str, float]:
    """A Server-Timing header's durations by name (`route;dur=1.5, prefill;dur=250`);
    entries without a duration, or with a bad one, are left out."""
    phases: dict[str, float] = {}
    for entry in (header or "").split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if name and key.strip() == "dur":
                try:
                    phases[name] = float(value.strip().strip('"'))
                except ValueError:
                    pass
    return phases


def served_by_of(headers) -> dict[str, str]:
    """The workers pdspec's proxy says served a reply (its served_by_headers)."""
    found = {"prefill": headers.get("x-pdspec-prefill-worker"), "decode": headers.get("x-pdspec-decode-worker")}
    return {role: url for role, url in found.items() if url}


async def run_load(
    url: str,
    bodies: list[dict],
    concurrency: int | None,
    request_rate: float | None,
    seed: int = 0,
    timeout_s: float = 600.0,
    on_done: Callable[[RequestResult], None] | None = None,
    offsets: list[float] | None = None,
) -> tuple[list[RequestResult], float]:
    """Send every body: at most `concurrency` in flight, arrivals a Poisson process of
    `request_rate` per second (None: all at once). With `offsets` (one per body, seconds
    from the start, non-decreasing: vllm_send_offsets), body i arrives at start +
    offsets[i] instead, whatever `request_rate`; a late loop sends at once, and the ones
    after keep their own instants, as vLLM's tool does. Returns the results and the window's
    length, from the start (the first arrival, or with `offsets` the instant they count
    from, as vLLM's duration does) to the last reply done."""
    if offsets is not None and len(offsets) != len(bodies):
        raise ValueError(f"{len(offsets)} send offsets for {len(bodies)} requests")
    limit = concurrency or len(bodies)
    gate = asyncio.Semaphore(limit)
    rng = random.Random(seed)
    pool = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)

    async with httpx.AsyncClient(timeout=timeout_s, limits=pool) as client:

        async def one(body: dict) -> RequestResult:
            async with gate:
                result = await stream_completion(client, url, body)
            if on_done is not None:
                on_done(result)
            return result

        started = time.perf_counter()
        tasks = []
        for i, body in enumerate(bodies):
            if offsets is not None and (wait := started + offsets[i] - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(body)))
            if offsets is None and request_rate and i + 1 < len(bodies):
                await asyncio.sleep(rng.expovariate(request_rate))  # the arrival process itself
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - started
