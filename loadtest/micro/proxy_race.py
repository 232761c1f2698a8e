"""The proxy race: pdspec's proxy against vLLM's Rust router (`vllm-router`, P/D mode), side
by side in one run, in front of the same two instantly answering workers.

    python -m loadtest.proxy_race                                   # the whole race, about 17 min
    python -m loadtest.proxy_race --rounds 1 --seconds 2 --connections 1,8 --out /tmp/race-smoke

Needs `wrk` and `taskset` on PATH (Debian: `apt-get install wrk util-linux`), matplotlib
for the plot (the `bench` extra), and vLLM's router in a venv of its own, so its
dependencies never meet vLLM's: `python -m venv /opt/router && /opt/router/bin/pip install
vllm-router==0.1.17`, then `--router /opt/router/bin/vllm-router` (or `VLLM_ROUTER=...`,
or `vllm-router` on PATH). Two cores at least, and a quiet machine for figures worth
keeping: each proxy runs on `--proxy-cpus` (core 0), wrk and the workers on `--load-cpus`
(core 1), so anything else running there is measured too.

What runs:
- two `loadtest.micro.instant_worker` processes, one prefill and one decode worker; a
  streamed reply is `--stream-tokens` (64) token events sent as fast as the socket takes
  them;
- per pairing (`--pairings`), a pdspec proxy and a router with the pairing's policy on
  both pools, all started before the first run and idle while another is measured:
  `round_robin` (pdspec round_robin, router round_robin) and `kv_aware` (pdspec kv_aware,
  which reads a text prompt's ids from the decode worker's /tokenize; the router's
  cache_aware, which renders it on the workers' /v1/completions/render);
- per shape (`--shapes`): `whole` (a non-streamed completion) and `stream` (streamed);
  every request a text prompt of the pairing's length (round_robin 8 words: the hot path
  alone; kv_aware 2,000: routing's cost; `--prompt-tokens` sets both), one of `--prompts` (16)
  seeded prompts in turn, `max_tokens` the stream's length;
- wrk for `--seconds` (10) at each of `--connections` (1, 8, 64, 256), `--rounds` (3)
  times. Rounds are outermost, so a point's runs are spread over the whole race and its
  spread shows the machine's drift; within a round every contender runs every point once,
  pdspec first in even rounds and the router first in odd ones.

Before the runs, each contender answers one request of every shape in every pairing, and
the race stops if any reply is not the worker's (a whole reply's text, a stream's token
events and `[DONE]`). wrk counts a request done when its response ends.

Per run, in `proxy_race.json` (`runs`): wrk's req/s, p50 and p99, requests, its error
counts (status >= 400 and socket errors), the proxy's CPU use (share of one core), the
busy share of the proxy's and the load's cores, and the calls each worker answered per
request (`loadtest.micro.instant_worker` KINDS). `summary`: each point's mean and
min..max per contender, and pdspec / router ratios. `proxy_race.md` has the tables (a
run with errors is flagged), `proxy_race.png` req/s against connections with the spread
as error bars. pdspec's proxies run with their defaults but for the pairing's policies;
`--set KEY=VALUE` changes every pdspec proxy's settings (ProxySettings' dotted keys,
e.g. `routing.tokenize_timeout_s=1`), and a new pairing is one entry in PAIRINGS.

Each run starts once the workers have answered nothing for 0.1 s (the previous run's
requests still in flight when its wrk stopped are not this run's load), and its calls on
the workers are counted until they are quiet again.

Failure policy: a process that does not come up or exits during the race, or a preflight
reply that is not the worker's, ends the race with the reason (every process's log is
under `--out`/logs); a wrk run with errors is kept and flagged, never retried;
`proxy_race.json` is rewritten after every run, so a race cut short keeps what it
measured (`complete`: false); every started process is stopped by its process group on
the way out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

from loadtest.micro import pinned, proxy_race_report
from loadtest.micro.instant_worker import KINDS, MODEL
from loadtest.micro.proxy_race_report import PDSPEC, ROUTER
from loadtest.micro.wrk import post_script, run_wrk
from loadtest.serving.bench import parse_set
from pdspec.settings import ProxySettings

CONTENDERS = (PDSPEC, ROUTER)
SHAPES = {"whole": False, "stream": True}  # name: streamed
DEFAULT_CONNECTIONS = (1, 8, 64, 256)
# Common English words, so a real tokenizer also makes about a token of each (the shipped
# model's 4,096-token vocabulary: 2,382-2,404 for four 2,000-word prompts); the instant worker, exactly one.
WORDS = (
    "the of and to in is that it was for on are as with his they at be this from have or by one had not but "
    "what all were when we there can an your which their said if do will each about how up out them then she "
    "many some so these would other into has more her two like him see time could no make than first been its "
    "who now people my made over did down only way find use may water long little very after words called just "
    "where most know get through back much go good new write our me man too any day same right look think also "
    "around another came come work three word must because does part even place well such here take why help"
).split()


@dataclass(frozen=True)
class Pairing:
    """pdspec's settings (ProxySettings' groups, over the race's base) against a router policy,
    on prompts of `prompt_tokens` words (`--prompt-tokens` overrides it for every pairing)."""

    pdspec: dict
    router_policy: str
    label: str
    prompt_tokens: int


PAIRINGS = {
    "round_robin": Pairing(
        pdspec={"routing": {"prefill_policy": "round_robin", "decode_policy": "round_robin"}},
        router_policy="round_robin",
        label="pdspec round_robin / router round_robin",
        prompt_tokens=8,  # the hot path alone: a short prompt, as in issue 42's first race
    ),
    "kv_aware": Pairing(
        pdspec={"routing": {"prefill_policy": "kv_aware", "decode_policy": "kv_aware"}},
        router_policy="cache_aware",
        label="pdspec kv_aware / router cache_aware",
        prompt_tokens=2000,  # routing's cost: both tokenize (or render) the prompt
    ),
}


@dataclass(frozen=True)
class Run:
    """One wrk run of the race's schedule."""

    round: int
    pairing: str
    shape: str
    connections: int
    contender: str


@dataclass
class Ports:
    """The race's ports from `base`: the two workers, then each pairing's two proxies and
    the router's Prometheus listener (it always opens one)."""

    base: int
    pairings: list[str] = field(default_factory=list)

    @property
    def prefill(self) -> int:
        return self.base + 1

    @property
    def decode(self) -> int:
        return self.base + 2

    def proxy(self, pairing: str, contender: str) -> int:
        return self.base + 10 + 2 * self.pairings.index(pairing) + CONTENDERS.index(contender)

    def router_metrics(self, pairing: str) -> int:
        return self.base + 50 + self.pairings.index(pairing)


# --- the workload -------------------------------------------------------------------------


def prompts(count: int, words: int, seed: int = 0) -> list[str]:
    """`count` distinct text prompts of `words` words each, the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join([f"prompt{i}", *rng.choices(WORDS, k=words - 1)]) for i in range(count)]


def request_bodies(texts: list[str], streamed: bool, max_tokens: int) -> list[str]:
    """The JSON bodies wrk posts, one per prompt."""
    return [
        json.dumps({"model": MODEL, "prompt": text, "max_tokens": max_tokens, "stream": streamed}) for text in texts
    ]


def schedule(
    rounds: int, pairings: list[str], shapes: list[str], connections: list[int], contenders=CONTENDERS
) -> list[Run]:
    """Every run of the race in order: rounds outermost, every contender once per point
    and round, in `round_order`."""
    return [
        Run(r, pairing, shape, c, contender)
        for r in range(rounds)
        for pairing in pairings
        for shape in shapes
        for c in connections
        for contender in round_order(contenders, r)
    ]


def round_order(contenders: tuple[str, ...] | list[str], round_index: int) -> list[str]:
    """The contenders in round `round_index`: as given in even rounds, reversed in odd ones,
    so neither always runs right after the other's load."""
    return list(contenders) if round_index % 2 == 0 else list(reversed(contenders))


# --- the contenders -----------------------------------------------------------------------


def set_dotted(settings: dict, key: str, value: object) -> None:
    """settings[a][b] = value for key "a.b" (groups created as needed)."""
    *groups, name = key.split(".")
    for group in groups:
        settings = settings.setdefault(group, {})
    settings[name] = value


def pdspec_settings(
    pairing: Pairing, port: int, prefill_url: str, decode_url: str, overrides: dict[str, object] | None = None
) -> dict:
    """A pdspec proxy's settings (`PDSPEC_PROXY`): its defaults but for where it listens,
    its workers, the pairing's groups and `overrides` (dotted keys); checked against
    ProxySettings, so a wrong key fails here, not in a child process."""
    settings = json.loads(json.dumps(pairing.pdspec))  # a copy the overrides may change
    settings.update(port=port, prefill_urls=[prefill_url], decode_urls=[decode_url])
    for key, value in (overrides or {}).items():
        set_dotted(settings, key, value)
    ProxySettings.model_validate(settings)
    return settings


def pdspec_command(settings: dict) -> tuple[list[str], dict[str, str]]:
    """`pdspec proxy` with `settings`: its argv and the environment that carries them."""
    return [sys.executable, "-m", "pdspec.cli", "proxy"], {"PDSPEC_PROXY": json.dumps(settings)}


def router_argv(
    router: str, pairing: Pairing, port: int, prefill_url: str, decode_url: str, metrics_port: int
) -> list[str]:
    """vLLM's router in its P/D mode (NIXL, its default connector) with the pairing's
    policy on both pools; its defaults otherwise. Its workers are checked for health every
    second while it starts (30 s by default, which would only delay the race)."""
    return [
        router,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--vllm-pd-disaggregation",
        "--prefill",
        prefill_url,
        "--decode",
        decode_url,
        "--policy",
        pairing.router_policy,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
        "--worker-startup-check-interval",
        "1",
    ]


def find_router(given: str | None) -> str:
    """--router, else $VLLM_ROUTER, else `vllm-router` on PATH."""
    router = given or os.environ.get("VLLM_ROUTER") or shutil.which("vllm-router")
    if not router or not shutil.which(router):
        raise SystemExit(
            "needs vLLM's router: --router PATH, VLLM_ROUTER=PATH or vllm-router on PATH "
            "(python -m venv /opt/router && /opt/router/bin/pip install vllm-router==0.1.17)"
        )
    return router


# --- checks -------------------------------------------------------------------------------


def check_reply(status: int, body: bytes, streamed: bool, stream_tokens: int) -> str | None:
    """What is wrong with a proxy's reply to the race's request, or None: a whole reply
    carries the worker's text; a stream, `stream_tokens` token events then [DONE]."""
    if status != 200:
        return f"status {status}: {body[:300]!r}"
    if not streamed:
        try:
            text = json.loads(body)["choices"][0]["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            return f"not a completion: {body[:300]!r}"
        return None if text == " hello world" else f"text {text!r}, not the worker's"
    events = [line[5:].strip() for line in body.decode(errors="replace").splitlines() if line.startswith("data:")]
    if not events or events[-1] != "[DONE]":
        return f"the stream does not end with [DONE]: {body[-300:]!r}"
    texts = []
    for event in events[:-1]:
        try:
            choices = json.loads(event).get("choices") or []
        except ValueError:
            return f"an event is not JSON: {event[:200]!r}"
        texts += [choice.get("text") for choice in choices if choice.get("text")]
    if len(texts) != stream_tokens:
        return f"{len(texts)} token events, not {stream_tokens}"
    return None


def preflight(url: str, body: str, streamed: bool, stream_tokens: int) -> str | None:
    """One request through a proxy; what is wrong with its reply, or None."""
    try:
        reply = httpx.post(
            url + "/v1/completions", content=body, headers={"Content-Type": "application/json"}, timeout=30
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return check_reply(reply.status_code, reply.content, streamed, stream_tokens)


def worker_counts(url: str) -> dict[str, int]:
    return httpx.get(url + "/stats", timeout=5).json()


# A worker's GETs (health checks, /metrics, /stats) come with time, not with requests.
PER_REQUEST_KINDS = tuple(kind for kind in KINDS if kind not in ("metrics", "stats", "other"))


def per_request(before: dict[str, int], after: dict[str, int], requests: int | None) -> dict[str, float]:
    """The calls a worker answered per completed request between two of its /stats
    (POSTs only; kinds it did not answer left out)."""
    if not requests:
        return {}
    deltas = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in PER_REQUEST_KINDS}
    return {kind: round(delta / requests, 3) for kind, delta in deltas.items() if delta}


def busy_shares(before, after, cpus: list[int]) -> float | None:
    """The busy share of `cpus` between two psutil.cpu_times(percpu=True) readings."""
    busy = total = 0.0
    for cpu in cpus:
        if cpu >= len(before):
            return None
        spent = sum(after[cpu]) - sum(before[cpu])
        idle = (after[cpu].idle + getattr(after[cpu], "iowait", 0)) - (
            before[cpu].idle + getattr(before[cpu], "iowait", 0)
        )
        busy += spent - idle
        total += spent
    return round(busy / total, 3) if total > 0 else None


def cpu_list(cpus: str) -> list[int]:
    """A taskset list ("0", "0,2", "0-3") as CPU numbers."""
    numbers = []
    for part in cpus.split(","):
        low, _, high = part.partition("-")
        numbers += range(int(low), int(high or low) + 1)
    return numbers


# --- the race -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="runs of every point per contender (default 3)")
    parser.add_argument("--seconds", type=int, default=10, help="length of one wrk run, whole seconds (default 10)")
    parser.add_argument("--connections", default=",".join(map(str, DEFAULT_CONNECTIONS)), help="comma-separated")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--pairings", default=",".join(PAIRINGS), help=f"comma-separated, of {', '.join(PAIRINGS)}")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        help="words (instant-worker tokens) per prompt, every pairing (default: the pairing's, 8 or 2000)",
    )
    parser.add_argument("--prompts", type=int, default=16, help="distinct prompts, sent in turn")
    parser.add_argument("--stream-tokens", type=int, default=64, help="token events in a streamed reply")
    parser.add_argument("--warmup-seconds", type=int, default=2, help="wrk warm-up per proxy and shape")
    parser.add_argument(
        "--worker-tokenizer",
        help="a model folder or tokenizer.json the workers' /tokenize answers with (default: a token per word); "
        "with --set routing.tokenizer=<the same>, pdspec's kv_aware tokenizes in the proxy",
    )
    parser.add_argument("--router", help="vllm-router's path (default: $VLLM_ROUTER, or vllm-router on PATH)")
    parser.add_argument("--proxy-cpus", default="0", help="taskset list for each proxy (default 0)")
    parser.add_argument("--load-cpus", default="1", help="taskset list for wrk and the workers (default 1)")
    parser.add_argument("--base-port", type=int, default=31400, help="ports from here up to +60")
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="settings of every pdspec proxy, ProxySettings' dotted keys (routing.tokenize_timeout_s=1)",
    )
    parser.add_argument("--out", type=Path, default=Path("loadtest/results/proxy_race"))
    args = parser.parse_args(argv)
    args.connections = [int(c) for c in args.connections.split(",") if c.strip()]
    args.shapes = chosen(args.shapes, SHAPES, "--shapes")
    args.pairings = chosen(args.pairings, PAIRINGS, "--pairings")
    return args


def chosen(given: str, known: dict, option: str) -> list[str]:
    names = [name.strip() for name in given.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise SystemExit(f"{option}: unknown {unknown or 'empty list'}; known: {', '.join(known)}")
    return names


@dataclass
class Contender:
    process: subprocess.Popen
    url: str
    ready_path: str


def start_workers(args, ports: Ports, logs: Path) -> list[subprocess.Popen]:
    workers = []
    for role, port in (("prefill", ports.prefill), ("decode", ports.decode)):
        argv = [sys.executable, "-m", "loadtest.micro.instant_worker", "--port", str(port)]
        argv += ["--stream-tokens", str(args.stream_tokens)]
        if args.worker_tokenizer:
            argv += ["--tokenizer", str(args.worker_tokenizer)]
        workers.append(pinned.start(argv, args.load_cpus, log=logs / f"{role}-worker.log"))
        pinned.wait_http(f"http://127.0.0.1:{port}/health", process=workers[-1])
    return workers


def start_contenders(
    args, ports: Ports, settings: dict[str, dict], router: str, worker_urls: dict[str, str], logs: Path
) -> dict[tuple[str, str], Contender]:
    """Every pairing's pdspec proxy and router, started together and waited for (pdspec's
    /ready answers 503 until its workers are checked)."""
    contenders = {}
    for name in args.pairings:
        argv, env = pdspec_command(settings[name])
        process = pinned.start(argv, args.proxy_cpus, env=env, log=logs / f"pdspec-{name}.log")
        contenders[name, PDSPEC] = Contender(process, f"http://127.0.0.1:{ports.proxy(name, PDSPEC)}", "/ready")
        port = ports.proxy(name, ROUTER)
        argv = router_argv(
            router, PAIRINGS[name], port, worker_urls["prefill"], worker_urls["decode"], ports.router_metrics(name)
        )
        process = pinned.start(argv, args.proxy_cpus, log=logs / f"router-{name}.log")
        contenders[name, ROUTER] = Contender(process, f"http://127.0.0.1:{port}", "/health")
    for contender in contenders.values():
        pinned.wait_http(contender.url + contender.ready_path, timeout_s=90, process=contender.process)
    return contenders


def check_and_warm(args, contenders: dict[tuple[str, str], Contender], bodies: dict, scripts: Path) -> None:
    """Each contender answers one request of every shape as the worker does, then runs wrk
    for `--warmup-seconds`; the race stops at the first that does not."""
    for (name, contender), each in contenders.items():
        for shape in args.shapes:
            problem = preflight(each.url, bodies[name, shape][0], SHAPES[shape], args.stream_tokens)
            if problem:
                raise SystemExit(f"{contender} ({name}, {shape}) did not serve the race's request: {problem}")
            script = str(scripts / script_name(name, shape))
            run_wrk(each.url + "/v1/completions", 8, args.warmup_seconds, script, args.load_cpus)


def script_name(pairing: str, shape: str) -> str:
    return f"{pairing}-{shape}.lua"


def prompt_tokens_of(pairing: str, override: int | None) -> int:
    return override if override is not None else PAIRINGS[pairing].prompt_tokens


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not (shutil.which("wrk") and shutil.which("taskset")):
        raise SystemExit("needs wrk and taskset (Debian: apt-get install wrk util-linux)")
    router = find_router(args.router)
    ports = Ports(args.base_port, args.pairings)
    worker_urls = {
        role: f"http://127.0.0.1:{port}" for role, port in (("prefill", ports.prefill), ("decode", ports.decode))
    }
    overrides = parse_set(args.set)
    settings = {
        name: pdspec_settings(
            PAIRINGS[name], ports.proxy(name, PDSPEC), worker_urls["prefill"], worker_urls["decode"], overrides
        )
        for name in args.pairings
    }
    logs, scripts = args.out / "logs", args.out / "scripts"
    logs.mkdir(parents=True, exist_ok=True)
    scripts.mkdir(exist_ok=True)
    bodies = {}
    for name in args.pairings:
        texts = prompts(args.prompts, prompt_tokens_of(name, args.prompt_tokens))
        for shape in args.shapes:
            bodies[name, shape] = request_bodies(texts, SHAPES[shape], args.stream_tokens)
            (scripts / script_name(name, shape)).write_text(post_script(bodies[name, shape]))
    report = {
        "command": "python -m loadtest.proxy_race " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": {
            "rounds": args.rounds,
            "seconds": args.seconds,
            "connections": args.connections,
            "shapes": args.shapes,
            "pairings": {name: asdict(PAIRINGS[name]) for name in args.pairings},
            "prompt_tokens": {name: prompt_tokens_of(name, args.prompt_tokens) for name in args.pairings},
            "prompts": args.prompts,
            "stream_tokens": args.stream_tokens,
            "proxy_cpus": args.proxy_cpus,
            "load_cpus": args.load_cpus,
            "worker_tokenizer": args.worker_tokenizer,
            "router": router,
            "router_version": router_version(router),
            "pdspec_settings": settings,
            "cpus": psutil.cpu_count(),
            "load_average_at_start": list(os.getloadavg()),
        },
        "runs": [],
    }
    processes = []
    try:
        processes += start_workers(args, ports, logs)
        contenders = start_contenders(args, ports, settings, router, worker_urls, logs)
        processes += [contender.process for contender in contenders.values()]
        check_and_warm(args, contenders, bodies, scripts)
        print(f"all {len(contenders)} proxies answer every shape; warm", flush=True)
        runs = schedule(args.rounds, args.pairings, args.shapes, args.connections)
        started = time.monotonic()
        for i, run in enumerate(runs, 1):
            contender = contenders[run.pairing, run.contender]
            if contender.process.poll() is not None:
                raise SystemExit(f"{run.contender} ({run.pairing}) exited ({contender.process.returncode}); see {logs}")
            script = str(scripts / script_name(run.pairing, run.shape))
            report["runs"].append(measure(run, contender.process, contender.url, script, args, worker_urls))
            write(report, args.out, final=False)  # a race cut short keeps what it measured
            left_s = (time.monotonic() - started) / i * (len(runs) - i)
            line = proxy_race_report.progress_line(report["runs"][-1])
            print(f"[{i:>3}/{len(runs)}] {line}  ({left_s / 60:.1f} min left)", flush=True)
    finally:
        for process in reversed(processes):
            pinned.stop(process)
    print(write(report, args.out, final=True))
    return report


def write(report: dict, out: Path, final: bool) -> str:
    """proxy_race.json (runs and summary) and, when `final`, proxy_race.md and the plot;
    the markdown it wrote."""
    report["summary"] = proxy_race_report.summarize(report["runs"])
    report["complete"] = final
    (out / "proxy_race.json").write_text(json.dumps(report, indent=2))
    if not final:
        return ""
    table = proxy_race_report.markdown(report)
    (out / "proxy_race.md").write_text(table)
    proxy_race_report.plot(report, out / "proxy_race.png")
    return table


def router_version(router: str) -> str | None:
    """The router package's version, read from its launcher's own venv (None if unknown)."""
    python = Path(router).resolve().parent / "python"
    if not python.exists():
        return None
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-router'))"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or None


def measure(run: Run, process, url: str, script: str, args, worker_urls: dict[str, str]) -> dict:
    """One wrk run against one proxy, with its CPU use and the workers' calls per request.
    It starts once the workers are quiet (the last run's requests still in flight when wrk
    stopped are not this run's load) and counts their calls until they are quiet again."""
    workers_before = settled(worker_urls)
    cpu_before, cores_before, wall_before = (
        pinned.cpu_seconds(process.pid),
        psutil.cpu_times(percpu=True),
        time.monotonic(),
    )
    result = run_wrk(url + "/v1/completions", run.connections, args.seconds, script, args.load_cpus)
    cpu_after, cores_after, wall_after = (
        pinned.cpu_seconds(process.pid),
        psutil.cpu_times(percpu=True),
        time.monotonic(),
    )
    workers_after = settled(worker_urls)
    return {
        **asdict(run),
        **{key: value for key, value in result.items() if key != "connections"},
        "proxy_cpu": round((cpu_after - cpu_before) / (wall_after - wall_before), 3),
        "proxy_cores_busy": busy_shares(cores_before, cores_after, cpu_list(args.proxy_cpus)),
        "load_cores_busy": busy_shares(cores_before, cores_after, cpu_list(args.load_cpus)),
        "worker_calls_per_request": {
            role: per_request(workers_before[role], workers_after[role], result["requests"]) for role in worker_urls
        },
    }


def settled(worker_urls: dict[str, str], quiet_s: float = 0.1, timeout_s: float = 10) -> dict[str, dict[str, int]]:
    """Each worker's /stats once none of them answered a POST for `quiet_s` (or after
    `timeout_s`, as they are then)."""
    deadline = time.monotonic() + timeout_s
    counts = {role: worker_counts(url) for role, url in worker_urls.items()}
    while time.monotonic() < deadline:
        time.sleep(quiet_s)  # the quiet interval itself
        again = {role: worker_counts(url) for role, url in worker_urls.items()}
        if all(posts(again[role]) == posts(counts[role]) for role in worker_urls):
            return again
        counts = again
    return counts


def posts(counts: dict[str, int]) -> dict[str, int]:
    return {kind: counts.get(kind, 0) for kind in PER_REQUEST_KINDS}


if __name__ == "__main__":
    main()
