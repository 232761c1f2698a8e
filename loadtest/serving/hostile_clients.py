"""Hostile clients against a running proxy: slow heads, oversized headers, unfinished
bodies and idle connections, while one well-behaved client keeps sending requests.

    python -m loadtest.hostile_clients --url http://127.0.0.1:8000 --seconds 30 --out DIR

What it shows (issue 24): other clients keep being served, the proxy's memory stays
bounded, no worker is ejected. Two phases on the same stack, back to back: `calm` (the
good client alone), then `attack` (the good client plus the hostile ones). Each phase
reports the good client's requests (ok, failed, median and p99 latency), the proxy's
resident memory (before and its peak, read from the process listening on the proxy's
port), the fewest healthy workers the proxy reported, and its client refusals by reason.
Writes hostile_clients.json, hostile_clients.md and a timeline plot (hostile_clients.png)
to --out. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
from tqdm import tqdm

GOOD_BODY = {"model": "pdspec-tiny", "prompt": "def read_config(path):", "max_tokens": 8, "temperature": 0}
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: proxy\r\ncontent-type: application/json\r\n"


@dataclass
class Phase:
    name: str
    seconds: float
    ok: int = 0
    failed: int = 0
    latencies_s: list[float] = field(default_factory=list)
    rss_mb_start: float = 0.0
    rss_mb_peak: float = 0.0
    fewest_healthy: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, float] = field(default_factory=dict)
    hostile_connections: int = 0
    timeline: list[tuple[float, float, float]] = field(default_factory=list)  # (t, rss MB, latency s or nan)

    def summary(self) -> dict:
        lat = sorted(self.latencies_s)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None
        return {
            "phase": self.name,
            "seconds": self.seconds,
            "good_ok": self.ok,
            "good_failed": self.failed,
            "good_p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
            "good_p99_ms": round(1000 * p99, 1) if p99 is not None else None,
            "proxy_rss_mb_start": round(self.rss_mb_start, 1),
            "proxy_rss_mb_peak": round(self.rss_mb_peak, 1),
            "fewest_healthy_workers": self.fewest_healthy,
            "client_refusals": self.refusals,
            "hostile_connections": self.hostile_connections,
        }


def proxy_process(url: str) -> psutil.Process:
    """The process listening on `url`'s port (a proxy's or a worker's server)."""
    port = urlsplit(url).port or 80
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise RuntimeError(f"no process listens on port {port}")


def refusals(metrics_text: str) -> dict[str, float]:
    prefix = 'pdspec_proxy_client_refusals_total{reason="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.split()[-1])
        for line in metrics_text.splitlines()
        if line.startswith(prefix)
    }


async def good_client(url: str, phase: Phase, started: float, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                response = await client.post(url + "/v1/completions", json=GOOD_BODY)
                ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            latency = time.monotonic() - t0
            if ok:
                phase.ok += 1
                phase.latencies_s.append(latency)
            else:
                phase.failed += 1
            phase.timeline.append((time.monotonic() - started, float("nan"), latency if ok else float("nan")))


async def watcher(url: str, process: psutil.Process, phase: Phase, started: float, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            rss = process.memory_info().rss / 2**20
            phase.rss_mb_peak = max(phase.rss_mb_peak, rss)
            phase.timeline.append((time.monotonic() - started, rss, float("nan")))
            try:
                healthy = (await client.get(url + "/ready")).json()["healthy_workers"]
                for pool, count in healthy.items():
                    phase.fewest_healthy[pool] = min(phase.fewest_healthy.get(pool, 1 << 30), count)
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            await asyncio.sleep(0.25)  # sampling interval


async def _hold(host: str, port: int, send, phase: Phase, stop: asyncio.Event) -> None:
    """One hostile connection: `send(writer)` until the proxy closes it or the phase ends,
    then connect again."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.1)  # the proxy refused a connection: try again
            continue
        phase.hostile_connections += 1
        try:
            await send(writer, stop)
            await _closed_or_stopped(reader, stop)
        except OSError:
            pass
        finally:
            writer.close()


async def _closed_or_stopped(reader: asyncio.StreamReader, stop: asyncio.Event) -> None:
    """Until the proxy closes the connection (its refusal; then `_hold` connects again), 60 s,
    or the phase ends: a hostile client leaves with its phase instead of holding the run for
    the proxy's timeouts (a 6-s phase took about 60 s more)."""
    read, stopped = asyncio.ensure_future(reader.read()), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({read, stopped}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (read, stopped):
            task.cancel()
        await asyncio.gather(read, stopped, return_exceptions=True)


async def slow_head(writer, stop) -> None:
    writer.write(HEAD)
    while not stop.is_set():
        writer.write(b"X")
        await writer.drain()
        await asyncio.sleep(0.5)  # a byte every half second: the slow client itself


async def huge_header(writer, stop) -> None:
    writer.write(HEAD + b"X-Huge: ")
    chunk = b"a" * (1 << 20)
    for _ in range(256):  # up to 256 MB, until the proxy stops reading
        if stop.is_set():
            return
        writer.write(chunk)
        await writer.drain()


async def unfinished_body(writer, stop) -> None:
    writer.write(HEAD + b'content-length: 1000000\r\n\r\n{"model": ')
    await writer.drain()
    while not stop.is_set():
        await asyncio.sleep(0.5)


async def idle(writer, stop) -> None:
    while not stop.is_set():
        await asyncio.sleep(0.5)


async def run_phase(url: str, process: psutil.Process, name: str, seconds: float, hostile: dict[str, int]) -> Phase:
    phase = Phase(name, seconds, rss_mb_start=process.memory_info().rss / 2**20)
    host, port = urlsplit(url).hostname, urlsplit(url).port or 80
    async with httpx.AsyncClient(timeout=10) as client:
        before = refusals((await client.get(url + "/metrics")).text)
    stop = asyncio.Event()
    started = time.monotonic()
    kinds = {"slow_head": slow_head, "huge_header": huge_header, "unfinished_body": unfinished_body, "idle": idle}
    tasks = [
        asyncio.create_task(good_client(url, phase, started, stop)),
        asyncio.create_task(watcher(url, process, phase, started, stop)),
    ]
    tasks += [
        asyncio.create_task(_hold(host, port, kinds[kind], phase, stop))
        for kind, count in hostile.items()
        for _ in range(count)
    ]
    with tqdm(total=int(seconds), desc=name, unit="s") as bar:
        for _ in range(int(seconds)):
            await asyncio.sleep(1)
            bar.update(1)
            bar.set_postfix(ok=phase.ok, failed=phase.failed, rss_mb=round(phase.rss_mb_peak))
    stop.set()
    await asyncio.wait(tasks, timeout=70)
    for task in tasks:
        task.cancel()
    async with httpx.AsyncClient(timeout=10) as client:
        after = refusals((await client.get(url + "/metrics")).text)
    phase.refusals = {reason: after.get(reason, 0) - before.get(reason, 0) for reason in after}
    return phase


def write_report(phases: list[Phase], out: Path, hostile: dict[str, int]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    report = {"hostile": hostile, "phases": [p.summary() for p in phases]}
    (out / "hostile_clients.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = [
        "| phase | good ok | good failed | p50 ms | p99 ms | proxy RSS start -> peak (MB) | fewest healthy "
        "(prefill, decode) | refusals |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in (ph.summary() for ph in phases):
        healthy = p["fewest_healthy_workers"]
        refused = ", ".join(f"{k} {int(v)}" for k, v in p["client_refusals"].items() if v) or "none"
        rows.append(
            f"| {p['phase']} | {p['good_ok']} | {p['good_failed']} | {p['good_p50_ms']} | {p['good_p99_ms']} "
            f"| {p['proxy_rss_mb_start']} -> {p['proxy_rss_mb_peak']} | {healthy.get('prefill')}, "
            f"{healthy.get('decode')} | {refused} |"
        )
    hostile_line = ", ".join(f"{count} {kind}" for kind, count in hostile.items())
    (out / "hostile_clients.md").write_text(
        f"Hostile connections held during `attack`: {hostile_line}.\n\n" + "\n".join(rows) + "\n"
    )
    plot(phases, out / "hostile_clients.png")
    return report


def plot(phases: list[Phase], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat_ax, rss_ax) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    offset = 0.0
    for phase in phases:
        latency = [(offset + t, 1000 * v) for t, _, v in phase.timeline if v == v]
        rss = [(offset + t, v) for t, v, _ in phase.timeline if v == v]
        lat_ax.plot(*zip(*latency), ".", markersize=3, label=f"{phase.name}") if latency else None
        rss_ax.plot(*zip(*rss), label=phase.name) if rss else None
        offset += phase.seconds
        lat_ax.axvline(offset, color="grey", linewidth=0.5)
    lat_ax.set_ylabel("good request latency (ms)")
    rss_ax.set_ylabel("proxy RSS (MB)")
    rss_ax.set_xlabel("seconds")
    lat_ax.legend()
    fig.suptitle("A good client beside hostile ones (calm, then attack)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main_async(args) -> dict:
    process = proxy_process(args.url)
    hostile = {
        "slow_head": args.slow_heads,
        "huge_header": args.huge_headers,
        "unfinished_body": args.unfinished_bodies,
        "idle": args.idle,
    }
    phases = [
        await run_phase(args.url, process, "calm", args.seconds, {}),
        await run_phase(args.url, process, "attack", args.seconds, hostile),
    ]
    return write_report(phases, Path(args.out), hostile)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--seconds", type=float, default=30.0, help="per phase")
    parser.add_argument("--slow-heads", type=int, default=50)
    parser.add_argument("--huge-headers", type=int, default=4)
    parser.add_argument("--unfinished-bodies", type=int, default=50)
    parser.add_argument("--idle", type=int, default=50)
    parser.add_argument("--out", default="loadtest/results/hostile_clients")
    args = parser.parse_args(argv)
    report = asyncio.run(main_async(args))
    print((Path(args.out) / "hostile_clients.md").read_text())
    return report


if __name__ == "__main__":
    main()
