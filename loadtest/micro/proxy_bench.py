"""Proxy overhead benchmark: the proxy pinned to one core, an instantly answering
stand-in worker and `wrk` (Debian package) on the other core.

Measures, in one run: the worker alone at 1 connection (the floor), then the proxy at
1, 8 and 64 connections (non-streaming completions, each one a prefill and a decode
leg). Reports req/s, p50 and p99, writes a table and a plot.

    python -m loadtest.proxy_bench            # needs `wrk` and `taskset` on PATH
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "bench", "prompt": "hello world, this is a benchmark", "max_tokens": 16}'
"""


def wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)  # poll interval
    raise RuntimeError(f"{url} did not come up")


def start(argv: list[str], core: int, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        ["taskset", "-c", str(core), *argv],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=10)


def run_wrk(url: str, connections: int, seconds: int, script: Path) -> dict:
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def latency_ms(label: str) -> float:
        match = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        value, unit = float(match.group(1)), match.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    timeouts = re.search(r"timeout (\d+)", out)
    return {
        "connections": connections,
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50_ms": latency_ms("50"),
        "p99_ms": latency_ms("99"),
        "non_2xx": int(errors.group(1)) if errors else 0,
        "timeouts": int(timeouts.group(1)) if timeouts else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("loadtest/results"))
    parser.add_argument("--access-log", action="store_true", help="the proxy logs every request")
    args = parser.parse_args()
    if not (shutil.which("wrk") and shutil.which("taskset")):
        sys.exit("needs wrk and taskset (Debian: apt-get install wrk util-linux)")

    work = Path(tempfile.mkdtemp())
    script = work / "post.lua"
    script.write_text(LUA)
    worker = start([sys.executable, "-m", "loadtest.micro.instant_worker", "--port", "9190"], core=1)
    proxy_settings = {
        "port": 9180,
        "prefill_urls": ["http://127.0.0.1:9190"],
        "decode_urls": ["http://127.0.0.1:9190"],
        "observability": {"access_log": args.access_log},
        "admission": {"max_inflight": 1024},
    }
    proxy = start(
        [sys.executable, "-m", "pdspec.cli", "proxy"], core=0, env={"PDSPEC_PROXY": json.dumps(proxy_settings)}
    )
    rows = []
    try:
        wait_http("http://127.0.0.1:9190/health")
        wait_http("http://127.0.0.1:9180/ready")
        run_wrk("http://127.0.0.1:9180/v1/completions", 8, 2, script)  # warm-up
        rows.append(
            {"target": "worker direct", **run_wrk("http://127.0.0.1:9190/v1/completions", 1, args.seconds, script)}
        )
        for connections in (1, 8, 64):
            result = run_wrk("http://127.0.0.1:9180/v1/completions", connections, args.seconds, script)
            rows.append({"target": "proxy", **result})
            print(rows[-1], flush=True)
    finally:
        stop(proxy)
        stop(worker)

    table = [
        "| target | connections | req/s | p50 ms | p99 ms | non-2xx | timeouts |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        table.append(
            f"| {r['target']} | {r['connections']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {r['non_2xx']} | {r['timeouts']} |"
        )
    direct, one = rows[0], rows[1]
    summary = (
        f"\nproxy adds {one['p50_ms'] - direct['p50_ms']:.2f} ms p50 at 1 connection (two legs); "
        f"rate at 64 / rate at 8 = {rows[3]['rps'] / rows[2]['rps']:.2f}"
    )
    print("\n".join(table) + summary)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "proxy_bench.md").write_text("\n".join(table) + summary + "\n")
    (args.out / "proxy_bench.json").write_text(json.dumps(rows, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        proxy_rows = rows[1:]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar([str(r["connections"]) for r in proxy_rows], [r["rps"] for r in proxy_rows], color="tab:blue")
        ax.axhline(2000, color="tab:red", linestyle="--", label="target 2,000 req/s")
        ax.set_xlabel("concurrent connections")
        ax.set_ylabel("requests/s (proxy on one core)")
        ax.set_title("pdspec proxy, non-streaming, instant worker")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / "proxy_bench.png", dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
