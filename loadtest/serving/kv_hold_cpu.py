"""What a worker's processes cost while it holds prompts' KV for a read, against idle.

    python -m loadtest.kv_hold_cpu --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --out hold.json

Against a running 1P1D pair (`pdspec up`; run on the workers' host, it reads their
process trees): the prefill worker's and decode worker's CPU, in cores, over `--window`
seconds idle, then while the prefill worker holds the KV of `--prompts` fresh prompts
(prefill legs sent to it alone: vLLM keeps each request, blocks held, until a decode
worker reads it), then the KV read by decode legs (which frees it) and the transfer's
bytes checked. What the `kv_hold_wait` and `short_spin` engine features change; the
JSON also has the workers' pdspec_engine_feature states, so a run says which were on.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

import httpx
import psutil

from loadtest.serving import worker_metrics
from loadtest.serving.hostile_clients import proxy_process
from proxy.apis.legs import PREFILL_KV_REQUEST

LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def server_pid(url: str) -> int:
    """The process listening on `url`'s port (the worker's API server)."""
    try:
        return proxy_process(url).pid
    except RuntimeError:
        raise SystemExit(f"nothing on this host listens on {url}") from None


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) of a process and its descendants so far."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def tree_cores(pids: dict[str, int], window_s: float) -> dict[str, float]:
    """Each process tree's CPU over `window_s`, in cores."""
    start, wall = {role: tree_cpu_seconds(pid) for role, pid in pids.items()}, time.monotonic()
    time.sleep(window_s)  # the measurement window
    elapsed = time.monotonic() - wall
    return {role: round((tree_cpu_seconds(pid) - start[role]) / elapsed, 3) for role, pid in pids.items()}


def features(url: str) -> dict[str, str]:
    """The worker's engine features and their current states (the series at 1)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    states = {}
    for line in text.splitlines():
        if line.startswith("pdspec_engine_feature{") and line.rstrip().endswith(" 1.0"):
            labels = dict(LABEL.findall(line))
            states[labels["feature"]] = labels["state"]
    return states


def run(args) -> dict:
    pids = {"prefill": server_pid(args.prefill), "decode": server_pid(args.decode)}
    rng = random.Random(args.seed)
    model = httpx.get(args.prefill + "/v1/models", timeout=10).json()["data"][0]["id"]
    bodies = [
        {
            "model": model,
            "prompt": [rng.randrange(10, args.vocab) for _ in range(args.tokens)],
            "max_tokens": 1,
            "temperature": 0,
        }
        for _ in range(args.prompts)
    ]
    report = {
        "features": {"prefill": features(args.prefill), "decode": features(args.decode)},
        "prompts": args.prompts,
        "tokens": args.tokens,
        "window_s": args.window,
    }
    report["idle_cores"] = tree_cores(pids, args.window)
    with httpx.Client(timeout=300) as client:
        params = [
            client.post(
                args.prefill + "/v1/completions", json={**body, "kv_transfer_params": dict(PREFILL_KV_REQUEST)}
            ).json()["kv_transfer_params"]
            for body in bodies
        ]
        try:
            report["holding_cores"] = tree_cores(pids, args.window)
        finally:  # the decode worker reads the KV, which frees it on the prefill worker
            before = worker_metrics.parse(client.get(args.decode + "/metrics").text).get(
                "vllm:nixl_bytes_transferred_sum", 0.0
            )
            statuses = [
                client.post(args.decode + "/v1/completions", json={**body, "kv_transfer_params": p}).status_code
                for body, p in zip(bodies, params)
            ]
            after = worker_metrics.parse(client.get(args.decode + "/metrics").text).get(
                "vllm:nixl_bytes_transferred_sum", 0.0
            )
    report["reads"] = {"statuses": statuses, "bytes": after - before}
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.kv_hold_cpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefill", default="http://127.0.0.1:8100")
    parser.add_argument("--decode", default="http://127.0.0.1:8200")
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=960)
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return report


if __name__ == "__main__":
    main()
