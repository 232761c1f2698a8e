"""Soak: many mixed requests (streamed and not, completions and chat) through the proxy,
every response checked. A request is *lost* if it raised, timed out or got a non-200;
*malformed* if its body broke the OpenAI shape (bad JSON, no choices, a stream without
[DONE] or with an error event, usage that does not add up).

    python -m loadtest.soak --requests 1000            # starts `pdspec up` on spare ports
    python -m loadtest.soak --url http://127.0.0.1:8000 --requests 1000

Writes loadtest/results/soak.{md,json,png}; the end-to-end suite runs a smaller one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PROMPTS = [
    "def read_config(path):\n    with open(path) as",
    "import os\nimport sys\n\n\nclass",
    "    for key, value in sorted(items.items()):\n        if",
    'def _parse_header(line):\n    """Parse a header line."""\n',
    "class Queue:\n    def __init__(self, maxsize=0):\n        self.",
    "    try:\n        return self._cache[key]\n    except KeyError:\n",
]
CHATS = [
    "Write a Python function that parses a URL.",
    "import json",
    "How do I read a file line by line?",
]
KINDS = ("completions", "completions-stream", "chat", "chat-stream")


@dataclass
class Outcome:
    kind: str
    status: str  # ok | lost | malformed
    problem: str = ""
    latency_s: float = 0.0
    completion_tokens: int = 0


@dataclass
class SoakReport:
    requests: int
    concurrency: int
    seconds: float
    by_kind: dict[str, Counter] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(counts[status] for counts in self.by_kind.values())

    def table(self) -> str:
        rows = [
            "| kind | requests | ok | lost | malformed | p50 s | p99 s |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for kind in KINDS:
            counts, lat = self.by_kind.get(kind, Counter()), sorted(self.latencies.get(kind, []))
            if not lat:
                continue
            p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
            rows.append(
                f"| {kind} | {sum(counts.values())} | {counts['ok']} | {counts['lost']} | "
                f"{counts['malformed']} | {p50:.2f} | {p99:.2f} |"
            )
        return "\n".join(rows)


def request_mix(total: int, model: str, seed: int = 0) -> list[tuple[str, dict]]:
    """A reproducible mix: each kind equally often, varied lengths and sampling."""
    rng = random.Random(seed)
    mix = []
    for i in range(total):
        kind = KINDS[i % len(KINDS)]
        body: dict = {"model": model, "max_tokens": rng.randint(4, 32)}
        if rng.random() < 0.5:
            body["temperature"] = 0
        else:
            body.update(temperature=0.8, top_p=0.95, seed=rng.randint(0, 2**31))
        if kind.startswith("chat"):
            body["messages"] = [{"role": "user", "content": rng.choice(CHATS)}]
        else:
            body["prompt"] = rng.choice(PROMPTS) * rng.randint(1, 6)  # 20 to 300 tokens or so
        if kind.endswith("stream"):
            body["stream"] = True
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
        mix.append((kind, body))
    rng.shuffle(mix)
    return mix


def _check_choice(choice: dict, chat: bool) -> str:
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    if not isinstance(text, str):
        return "choice has no text"
    if choice.get("finish_reason") not in ("length", "stop"):
        return f"finish_reason {choice.get('finish_reason')!r}"
    return ""


def check_whole(data: bytes, body: dict, chat: bool) -> tuple[str, int]:
    try:
        reply = json.loads(data)
    except ValueError:
        return "body is not JSON", 0
    choices = reply.get("choices")
    if not isinstance(choices, list) or len(choices) != body.get("n", 1):
        return "wrong number of choices", 0
    for choice in choices:
        if problem := _check_choice(choice, chat):
            return problem, 0
    usage = reply.get("usage") or {}
    tokens = usage.get("completion_tokens")
    if not isinstance(tokens, int) or not 1 <= tokens <= body["max_tokens"]:
        return f"completion_tokens {tokens!r} outside 1..{body['max_tokens']}", 0
    if choices[0]["finish_reason"] == "length" and tokens != body["max_tokens"]:
        return f"finish_reason length after {tokens} of {body['max_tokens']} tokens", 0
    return "", tokens


def check_stream(events: list[str], body: dict, chat: bool) -> tuple[str, int]:
    if not events or events[-1] != "[DONE]":
        return "stream did not end with [DONE]", 0
    finish, usage, pieces = None, None, 0
    for event in events[:-1]:
        try:
            chunk = json.loads(event)
        except ValueError:
            return "event is not JSON", 0
        if "error" in chunk:
            return f"error event: {chunk['error'].get('message')}", 0
        for choice in chunk.get("choices") or []:
            pieces += 1
            finish = choice.get("finish_reason") or finish
        usage = chunk.get("usage") or usage
    if finish not in ("length", "stop"):
        return f"stream finish_reason {finish!r}", 0
    wants_usage = (body.get("stream_options") or {}).get("include_usage")
    tokens = (usage or {}).get("completion_tokens", 0)
    if wants_usage and not 1 <= tokens <= body["max_tokens"]:
        return f"stream usage completion_tokens {tokens!r}", 0
    if pieces == 0:
        return "stream carried no choices", 0
    return "", tokens


async def one_request(client: httpx.AsyncClient, url: str, kind: str, body: dict) -> Outcome:
    chat = kind.startswith("chat")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    started = time.perf_counter()
    try:
        if body.get("stream"):
            async with client.stream("POST", url + path, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    return Outcome(kind, "lost", f"HTTP {response.status_code}: {response.text[:200]}")
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    return Outcome(kind, "malformed", "stream without text/event-stream")
                events = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
            problem, tokens = check_stream(events, body, chat)
        else:
            response = await client.post(url + path, json=body)
            if response.status_code != 200:
                return Outcome(kind, "lost", f"HTTP {response.status_code}: {response.text[:200]}")
            problem, tokens = check_whole(response.content, body, chat)
    except (httpx.HTTPError, asyncio.TimeoutError) as exc:
        return Outcome(kind, "lost", f"{type(exc).__name__}: {exc}")
    latency = time.perf_counter() - started
    return Outcome(kind, "malformed" if problem else "ok", problem, latency, tokens)


async def run_soak(
    url: str, model: str, total: int, concurrency: int, seed: int = 0, timeout_s: float = 300, progress: bool = False
) -> SoakReport:
    mix = request_mix(total, model, seed)
    queue: asyncio.Queue = asyncio.Queue()
    for item in mix:
        queue.put_nowait(item)
    outcomes: list[Outcome] = []
    started = time.perf_counter()

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            kind, body = queue.get_nowait()
            outcomes.append(await one_request(client, url, kind, body))
            if progress and len(outcomes) % 50 == 0:
                bad = sum(o.status != "ok" for o in outcomes)
                print(
                    f"  {len(outcomes)}/{total} done, {bad} lost or malformed, {time.perf_counter() - started:.0f} s",
                    flush=True,
                )

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    report = SoakReport(total, concurrency, time.perf_counter() - started)
    for outcome in outcomes:
        report.by_kind.setdefault(outcome.kind, Counter())[outcome.status] += 1
        if outcome.status == "ok":
            report.latencies.setdefault(outcome.kind, []).append(outcome.latency_s)
        else:
            report.problems.append(f"{outcome.kind}: {outcome.status}: {outcome.problem}")
    return report


def _start_stack(base_port: int, run_dir: Path) -> tuple[subprocess.Popen, str]:
    argv = [
        sys.executable,
        "-m",
        "pdspec.cli",
        "up",
        "--run_dir",
        str(run_dir),
        "--proxy.port",
        str(base_port),
        "--prefill.port",
        str(base_port + 100),
        "--decode.port",
        str(base_port + 200),
        "--prefill.side_channel_port",
        str(base_port + 300),
        "--decode.side_channel_port",
        str(base_port + 400),
    ]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    for line in process.stdout:
        print("  " + line.rstrip(), flush=True)
        if line.startswith("pdspec up: ready:"):
            return process, f"http://127.0.0.1:{base_port}"
    raise SystemExit("pdspec up exited before it was ready")


def _plot(report: SoakReport, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    kinds = [k for k in KINDS if report.latencies.get(k)]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.boxplot([report.latencies[k] for k in kinds], showfliers=True)
    ax.set_xticks(range(1, len(kinds) + 1), kinds)
    ax.set_ylabel("latency, s")
    ax.set_title(
        f"soak: {report.requests} requests at {report.concurrency} concurrent, "
        f"{report.count('lost')} lost, {report.count('malformed')} malformed"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running proxy; default: start `pdspec up` on --base-port")
    parser.add_argument("--model", default="pdspec-tiny")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--base-port", type=int, default=18500)
    parser.add_argument("--out", type=Path, default=Path("loadtest/results"))
    args = parser.parse_args()

    process = None
    url = args.url
    if url is None:
        import tempfile

        print("starting pdspec up (1P1D, local model)...", flush=True)
        process, url = _start_stack(args.base_port, Path(tempfile.mkdtemp(prefix="pdspec-soak-")))
    try:
        print(f"soak: {args.requests} requests, {args.concurrency} concurrent, against {url}", flush=True)
        report = asyncio.run(run_soak(url, args.model, args.requests, args.concurrency, progress=True))
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=60)
    summary = (
        f"\n{report.requests} requests in {report.seconds:.0f} s ({report.requests / report.seconds:.1f} req/s) "
        f"at {report.concurrency} concurrent: {report.count('lost')} lost, "
        f"{report.count('malformed')} malformed"
    )
    text = report.table() + summary + "\n" + "".join(f"- {p}\n" for p in report.problems[:20])
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.md").write_text(
        f"Command: python -m loadtest.soak --requests {args.requests} --concurrency {args.concurrency}\n\n" + text
    )
    data = {
        "requests": report.requests,
        "concurrency": report.concurrency,
        "seconds": report.seconds,
        "lost": report.count("lost"),
        "malformed": report.count("malformed"),
        "by_kind": {kind: dict(counts) for kind, counts in report.by_kind.items()},
        "problems": report.problems,
        "latencies_s": report.latencies,
    }
    (args.out / "soak.json").write_text(json.dumps(data, indent=1))
    _plot(report, args.out / "soak.png")
    sys.exit(1 if report.count("lost") or report.count("malformed") else 0)


if __name__ == "__main__":
    main()
