"""`python -m loadtest.micro.proxy_profile`: where pdspec's proxy spends its CPU per request,
by layer, as the proxy race runs it (loadtest/micro/proxy_race.py).

The same set-up as the race's pdspec side: the proxy pinned to `--proxy-cpus`, two
instantly answering workers and wrk on `--load-cpus`, the race's prompts and bodies. For
each shape (a whole completion, a stream) it runs wrk for `--seconds` while py-spy samples
the proxy (`--nonblocking`, so the proxy is never paused; py-spy itself runs on the load
cores), and reads the proxy's CPU time over the same window, so the shares come with what a
request costs in all.

Each sample is charged to a layer: the innermost frame of the stack that belongs to one of
`LAYERS` (so a socket write the worker client asked for is the worker client's, and one
uvicorn asked for is uvicorn's); a stack with no such frame is the event loop's own work.
Written to `--out` (default loadtest/results/proxy_race/profile/): `proxy_profile.json`
(per shape: requests, CPU µs per request, every layer's share of samples, self and
inclusive, and the 20 functions with most self samples), `proxy_profile.md` (the tables),
`proxy_profile.png` (the layers' self shares, a bar per shape) and `<shape>.collapsed.gz`
(py-spy's collapsed stacks: a flame graph from them with any folded-stacks tool).

Failure policy: the run stops at the first proxy or worker that does not answer the
race's request as the worker does (proxy_race.preflight), or when py-spy fails (it needs
ptrace rights over the proxy: root, or kernel.yama.ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from loadtest.micro import pinned
from loadtest.micro.proxy_race import (
    PAIRINGS,
    PDSPEC,
    SHAPES,
    Ports,
    pdspec_command,
    pdspec_settings,
    preflight,
    prompts,
    request_bodies,
    start_workers,
)
from loadtest.micro.wrk import post_script, run_wrk

# (layer, path fragments of its frames). Order matters only for a frame two would match.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("metrics", ("prometheus_client/", "proxy/metrics.py", "proxy/shared_metrics.py")),
    ("worker client", ("proxy/upstream/",)),
    ("endpoint (edge, asgi)", ("proxy/edge/", "proxy/asgi.py", "proxy/auth.py", "proxy/errors.py")),
    ("flow", ("proxy/flow/",)),
    ("apis and validation", ("proxy/apis/",)),
    ("routing and pools", ("proxy/routing/", "proxy/fleet/")),
    ("admission", ("proxy/admission/",)),
    ("tracing and logs", ("proxy/tracing.py", "proxy/logs.py", "proxy/loop_lag.py", "/logging/")),
    ("uvicorn (HTTP protocol, ASGI cycle)", ("uvicorn/", "httptools/")),
    ("app and middleware", ("starlette/", "fastapi/", "proxy/app.py")),
)
EVENT_LOOP = "event loop (uvloop's own C code) and the rest"
# The frames that run the event loop: what lies outside them (the command's start-up,
# uvicorn.run) is on every sample's stack and belongs to no request, so it is not charged.
LOOP_RUNNERS = ("Runner.run (asyncio/runners.py", "run_until_complete (", "run_forever (")


def frame_file(frame: str) -> str:
    """The file of one py-spy frame, `function (path:line)` (empty for a frame without one)."""
    if not frame.endswith(")") or " (" not in frame:
        return ""
    return frame[frame.rindex(" (") + 2 : -1].rsplit(":", 1)[0]


def layer_of(frame: str) -> str | None:
    path = frame_file(frame)
    for layer, fragments in LAYERS:
        if any(fragment in path for fragment in fragments):
            return layer
    return None


def parse_collapsed(text: str) -> list[tuple[list[str], int]]:
    """py-spy's raw output: one `outer;...;inner count` line per distinct stack. A process
    or thread frame py-spy puts first (`process 12:"python ..."`, `thread (0x...)`) is kept
    as a frame; it belongs to no layer."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def in_loop(frames: list[str]) -> list[str]:
    """The frames inside the event loop: those after its innermost runner frame (all of
    them when there is none)."""
    runners = [i for i, frame in enumerate(frames) if any(mark in frame for mark in LOOP_RUNNERS)]
    return frames[runners[-1] + 1 :] if runners else frames


def charge(stacks: list[tuple[list[str], int]]) -> dict:
    """Samples by layer, counting only the frames inside the event loop (`in_loop`):
    `self` charges each sample to its innermost frame of a layer (the event loop's when
    none: a sample in the loop's own C code shows no Python frame inside it); `inclusive`
    counts the samples with any frame of a layer; `functions`, the innermost frames with
    most samples."""
    total = sum(count for _, count in stacks)
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    functions: collections.Counter = collections.Counter()
    for frames, count in stacks:
        layers = [layer_of(frame) for frame in in_loop(frames)]
        own[next((layer for layer in reversed(layers) if layer is not None), EVENT_LOOP)] += count
        for layer in set(layers) - {None}:
            inclusive[layer] += count
        functions[frames[-1]] += count

    def shares(counter: collections.Counter) -> dict[str, float]:
        return {layer: round(counter[layer] / total, 4) for layer, _ in counter.most_common()} if total else {}

    return {
        "samples": total,
        "self": shares(own),
        "inclusive": shares(inclusive),
        "top_functions": [
            {"frame": frame, "share": round(count / total, 4)} for frame, count in functions.most_common(20)
        ],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loadtest.micro.proxy_profile", description=__doc__.split("\n")[0])
    parser.add_argument("--pairing", default="round_robin", choices=sorted(PAIRINGS))
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=10, help="wrk's and py-spy's window per shape")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples a second")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--stream-tokens", type=int, default=64)
    parser.add_argument("--worker-tokenizer", type=Path, default=None, help="as the race's (kv_aware)")
    parser.add_argument("--proxy-cpus", default="0")
    parser.add_argument("--load-cpus", default="1")
    parser.add_argument("--base-port", type=int, default=31500)
    parser.add_argument("--py-spy", default=None, help="py-spy's path (default: beside this Python, or on PATH)")
    parser.add_argument("--out", type=Path, default=Path("loadtest/results/proxy_race/profile"))
    args = parser.parse_args(argv)
    args.shapes = [shape for shape in args.shapes.split(",") if shape]
    unknown = set(args.shapes) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shapes {sorted(unknown)}")
    return args


def find_py_spy(given: str | None) -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = given or (str(beside) if beside.exists() else shutil.which("py-spy"))
    if not found:
        raise SystemExit("needs py-spy (pip install py-spy; the bench extras have it)")
    return found


def profile_shape(args, py_spy: str, proxy: subprocess.Popen, url: str, script: str, out: Path, shape: str) -> dict:
    """One shape: wrk for `--seconds` with py-spy sampling the proxy over the same window."""
    collapsed = out / f"{shape}.collapsed"
    sampler = subprocess.Popen(
        ["taskset", "-c", args.load_cpus, py_spy, "record", "--pid", str(proxy.pid), "--rate", str(args.rate)]
        + ["--duration", str(args.seconds), "--format", "raw", "--nonblocking", "--output", str(collapsed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cpu_before = pinned.cpu_seconds(proxy.pid)
    result = run_wrk(url + "/v1/completions", args.connections, args.seconds, script, args.load_cpus)
    cpu_after = pinned.cpu_seconds(proxy.pid)
    output, _ = sampler.communicate(timeout=args.seconds + 60)
    if sampler.returncode != 0 or not collapsed.exists():
        raise SystemExit(f"py-spy failed ({sampler.returncode}): {output[-2000:]}")
    text = collapsed.read_text()
    with gzip.open(out / f"{shape}.collapsed.gz", "wt") as kept:
        kept.write(text)
    collapsed.unlink()
    requests = result["requests"] or 0
    return {
        "shape": shape,
        "requests": requests,
        "rps": result["rps"],
        "errors": result["errors"],
        "cpu_us_per_request": round(1e6 * (cpu_after - cpu_before) / requests, 1) if requests else None,
        **charge(parse_collapsed(text)),
    }


def layers_of(shapes: list[dict]) -> set[str]:
    return {layer for shape in shapes for layer in shape["self"]}


def markdown(report: dict) -> str:
    shapes = report["shapes"]
    layers = sorted(layers_of(shapes), key=lambda layer: -shapes[0]["self"].get(layer, 0))
    head = " | ".join(shape["shape"] for shape in shapes)
    lines = [
        f"# Where the proxy's CPU goes ({report['config']['pairing']}, {report['config']['connections']} connections)",
        "",
        f"`{report['command']}`, {report['started']}. py-spy at {report['config']['rate']} Hz, nonblocking.",
        "",
        "| | " + head + " |",
        "| --- | " + " | ".join("---" for _ in shapes) + " |",
        "| req/s | " + " | ".join(f"{s['rps']:,.0f}" for s in shapes) + " |",
        "| proxy CPU per request (µs) | " + " | ".join(str(s["cpu_us_per_request"]) for s in shapes) + " |",
        "| samples | " + " | ".join(str(s["samples"]) for s in shapes) + " |",
        "",
        "Self share: each sample charged to its innermost frame of a layer (inclusive in brackets).",
        "",
        "| layer | " + head + " |",
        "| --- | " + " | ".join("---" for _ in shapes) + " |",
    ]
    for layer in layers:
        cells = [f"{s['self'].get(layer, 0):.1%} ({s['inclusive'].get(layer, 0):.0%})" for s in shapes]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    for shape in shapes:
        lines += ["", f"Top functions by self samples, {shape['shape']}:", "", "| share | frame |", "| --- | --- |"]
        lines += [f"| {f['share']:.1%} | `{f['frame']}` |" for f in shape["top_functions"][:12]]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = report["shapes"]
    layers = sorted(layers_of(shapes), key=lambda layer: shapes[0]["self"].get(layer, 0))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(layers) + 1.5))
    height = 0.8 / len(shapes)
    for i, shape in enumerate(shapes):
        ax.barh(
            [y + i * height for y in range(len(layers))],
            [100 * shape["self"].get(layer, 0) for layer in layers],
            height,
            label=f"{shape['shape']} ({shape['cpu_us_per_request']} µs/request)",
        )
    ax.set_yticks([y + height * (len(shapes) - 1) / 2 for y in range(len(layers))], layers)
    ax.set_xlabel("share of the proxy's CPU samples (%)")
    ax.set_title(f"pdspec proxy, {report['config']['pairing']}, {report['config']['connections']} connections")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not (shutil.which("wrk") and shutil.which("taskset")):
        raise SystemExit("needs wrk and taskset (Debian: apt-get install wrk util-linux)")
    py_spy = find_py_spy(args.py_spy)
    ports = Ports(args.base_port, [args.pairing])
    worker_urls = {"prefill": f"http://127.0.0.1:{ports.prefill}", "decode": f"http://127.0.0.1:{ports.decode}"}
    port = ports.proxy(args.pairing, PDSPEC)
    settings = pdspec_settings(PAIRINGS[args.pairing], port, worker_urls["prefill"], worker_urls["decode"])
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    texts = prompts(args.prompts, PAIRINGS[args.pairing].prompt_tokens)
    report = {
        "command": "python -m loadtest.micro.proxy_profile " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "layers": {layer: list(fragments) for layer, fragments in LAYERS},
        "shapes": [],
    }
    processes = []
    try:
        processes += start_workers(args, ports, logs)
        argv_, env = pdspec_command(settings)
        proxy = pinned.start(argv_, args.proxy_cpus, env=env, log=logs / "pdspec.log")
        processes.append(proxy)
        url = f"http://127.0.0.1:{port}"
        pinned.wait_http(url + "/ready", timeout_s=90, process=proxy)
        for shape in args.shapes:
            bodies = request_bodies(texts, SHAPES[shape], args.stream_tokens)
            problem = preflight(url, bodies[0], SHAPES[shape], args.stream_tokens)
            if problem:
                raise SystemExit(f"pdspec ({shape}) did not serve the race's request: {problem}")
            script = logs / f"{shape}.lua"
            script.write_text(post_script(bodies))
            run_wrk(url + "/v1/completions", args.connections, 2, str(script), args.load_cpus)  # warm-up
            measured = profile_shape(args, py_spy, proxy, url, str(script), args.out, shape)
            report["shapes"].append(measured)
            top = ", ".join(f"{layer} {share:.0%}" for layer, share in list(measured["self"].items())[:4])
            print(f"{shape}: {measured['rps']:,.0f} req/s, {measured['cpu_us_per_request']} µs/request; {top}")
    finally:
        for process in reversed(processes):
            pinned.stop(process)
    (args.out / "proxy_profile.json").write_text(json.dumps(report, indent=2))
    table = markdown(report)
    (args.out / "proxy_profile.md").write_text(table)
    plot(report, args.out / "proxy_profile.png")
    print(table)
    return report


if __name__ == "__main__":
    main()
