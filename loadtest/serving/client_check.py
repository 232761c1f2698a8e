"""The benchmark client cross-checked on the fleet (issue 41, item 2): vLLM's `vllm bench
serve` and pdspec's serve_bench through one pdspec front of an xPyD fleet, compared by
loadtest.micro.bench_tools.

    python -m loadtest.client_check --out DIR --policy kv_aware --kv-blocks 2048 [fleet_bench's fleet flags] \\
        -- --dataset prefix-repetition --prefix-len 4096 --suffix-len 256 --num-prefixes 96 \\
           --output-len 48 --num-prompts 192 --request-rate 4 --rounds 2 --tokenizer PATH

Before `--`: the fleet, as loadtest.fleet_bench takes it (`pdspec up` started with the same
flags, its workers in VLLM_SERVER_DEV_MODE=1 so their prefix caches can be reset; or one
already running, `--attach`), and the front's `--policy` (one of fleet_bench's pdspec
policies). After `--`: bench_tools' flags, less `--url`, `--model`, `--prefill-url`,
`--decode-url` and `--out`, which this fills in: the front (base port + 1), the served
model, every prefill and decode worker of the fleet (the prefill pool's prefix-cache hit
rate, the decode pool's acceptance length, the resets) and DIR/bench_tools. The front's log
is DIR/front-POLICY.log; DIR/client_check.json says what ran and how long the start took.

Before the first run, `--warmup-requests` (8) prompts of the runs' length, random token ids,
4 tokens out, go through the front, 4 at a time: the first load on freshly started engines
is slower (seen on an H100: the first run's prefill at 10.5-11.8k tokens/s, the second's at
14.4-15.8k), and without it the tool that runs first pays that. bench_tools then resets the
prefix caches, so the warm-up leaves nothing cached.

Failure policy: a front that is not ready ends the check before any run (SystemExit); so
does a warm-up request that fails, and a tool that fails inside bench_tools. The front, and the fleet when this started it,
are stopped however the check ends (SIGINT and SIGTERM included); the exit status is 0 only
when bench_tools finished.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

from loadtest.micro import bench_tools
from loadtest.serving import fleet_bench
from loadtest.serving.serve_client import completion_body, random_prompts, run_load

FILLED_IN = ("--url", "--model", "--prefill-url", "--decode-url", "--out")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(this tool's flags, bench_tools' flags): the two sides of the first `--`."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def bench_tools_argv(args, workers: dict[str, list[str]], front_url: str, rest: list[str]) -> list[str]:
    """bench_tools' argv: the flags given after `--`, then the front, the model, every
    worker and the output folder; SystemExit when a flag given is one this fills in."""
    clashing = sorted({flag for flag in rest if flag.split("=")[0] in FILLED_IN})
    if clashing:
        raise SystemExit(f"client_check fills in {', '.join(clashing)}: leave them out after --")
    argv = [*rest, "--url", front_url, "--model", args.model, "--out", str(args.out / "bench_tools")]
    for url in workers["prefill"]:
        argv += ["--prefill-url", url]
    for url in workers["decode"]:
        argv += ["--decode-url", url]
    return argv


def prompt_length(tools_args) -> int:
    """The runs' prompt length in tokens: prefix + suffix for prefix repetition, else the input length."""
    if tools_args.dataset == "prefix-repetition":
        return tools_args.prefix_len + tools_args.suffix_len
    return tools_args.input_len


# Token ids below this are in every vocabulary the fleets run (the shipped shapes' 4,096).
WARMUP_VOCAB = 1000


async def warm_up(url: str, model: str, length: int, count: int, in_flight: int = 4) -> int:
    """`count` completions of `length` random token ids, 4 tokens out, at most `in_flight` at
    once, through `url`. Returns how many there were; raises SystemExit naming the first that failed."""
    bodies = [completion_body(model, prompt, 4) for prompt in random_prompts(count, length, WARMUP_VOCAB, seed=12345)]
    results, _ = await run_load(url, bodies, in_flight, None)
    failed = [r for r in results if not r.ok]
    if failed:
        raise SystemExit(f"client_check: {len(failed)} of {count} warm-up requests failed: {failed[0].error}")
    return count


def stop_on_sigterm() -> None:
    """SIGTERM as SystemExit, so the `finally` that stops the front and the fleet runs."""

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def run(args, rest: list[str]) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    workers = fleet_bench.fleet_urls(args)
    record: dict = {
        "command": "python -m loadtest.client_check " + " ".join(args.argv),
        "policy": args.policy,
        "workers": workers,
        "attached": args.attach,
    }
    # The front start_front_ends gives the first policy; bench_tools' flags checked before
    # anything starts (a typo found after a fleet's minutes of start-up costs them).
    front_url = f"http://127.0.0.1:{args.base_port + 1}"
    argv = bench_tools_argv(args, workers, front_url, rest)
    tools_args = bench_tools.parse_args(argv)
    record["bench_tools_argv"] = argv
    stop_on_sigterm()
    up, fronts = None, {}
    try:
        if not args.attach:
            os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # the workers' /reset_prefix_cache
            up, record["fleet_ready_s"] = fleet_bench.start_fleet(args)
            print(f"client_check: fleet ready after {record['fleet_ready_s']:.0f} s", flush=True)
        fronts = fleet_bench.start_front_ends(args, [args.policy], workers, args.out)
        front = fronts[args.policy]
        record["front"] = front["url"]
        if front["error"]:
            raise SystemExit(f"client_check: the {args.policy} front: {front['error']} (see its log in {args.out})")
        assert front["url"] == front_url, (front["url"], front_url)
        started = time.monotonic()
        length = prompt_length(tools_args)
        record["warmup"] = {"requests": asyncio.run(warm_up(front_url, args.model, length, args.warmup_requests))}
        record["warmup"]["s"] = time.monotonic() - started
        print(f"client_check: warmed up ({args.warmup_requests} x {length} tokens)", flush=True)
        started = time.monotonic()
        bench_tools.main(argv)
        record["bench_tools_s"] = time.monotonic() - started
    finally:
        fleet_bench.stop_front_ends(fronts)
        fleet_bench.stop_fleet(up)
        (args.out / "client_check.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> dict:
    ours, rest = split_argv(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.client_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--policy", default="kv_aware", choices=list(fleet_bench.POLICIES), help="the front's routing")
    parser.add_argument(
        "--warmup-requests", type=int, default=8, help="sent through the front before the first run (0: none)"
    )
    fleet_bench.add_fleet_arguments(parser)
    args = parser.parse_args(ours)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return run(args, rest)


if __name__ == "__main__":
    main()
