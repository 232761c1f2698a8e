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
import shutil
import sys
import tempfile
from pathlib import Path

from loadtest.micro.pinned import start, stop, wait_http
from loadtest.micro.wrk import post_script, run_wrk

BODY = '{"model": "bench", "prompt": "hello world, this is a benchmark", "max_tokens": 16}'


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
    script.write_text(post_script([BODY]))
    worker = start([sys.executable, "-m", "loadtest.micro.instant_worker", "--port", "9190"], cpus="1")
    proxy_settings = {
        "port": 9180,
        "prefill_urls": ["http://127.0.0.1:9190"],
        "decode_urls": ["http://127.0.0.1:9190"],
        "observability": {"access_log": args.access_log},
        "admission": {"max_inflight": 1024},
    }
    proxy = start(
        [sys.executable, "-m", "pdspec.cli", "proxy"], cpus="0", env={"PDSPEC_PROXY": json.dumps(proxy_settings)}
    )
    rows = []
    try:
        wait_http("http://127.0.0.1:9190/health")
        wait_http("http://127.0.0.1:9180/ready")
        run_wrk("http://127.0.0.1:9180/v1/completions", 8, 2, str(script))  # warm-up
        rows.append(
            {"target": "worker direct", **run_wrk("http://127.0.0.1:9190/v1/completions", 1, args.seconds, str(script))}
        )
        for connections in (1, 8, 64):
            result = run_wrk("http://127.0.0.1:9180/v1/completions", connections, args.seconds, str(script))
            rows.append({"target": "proxy", **result})
            print({k: v for k, v in rows[-1].items() if k != "report"}, flush=True)
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
            f"| {r['non_2xx']} | {r['socket_errors']['timeout']} |"
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
