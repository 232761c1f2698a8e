"""wrk (Debian's `wrk` package) for the micro benchmarks: the Lua script that posts JSON
bodies, the command line pinned to cores, and its report parsed.

`post_script` posts one body as wrk's static request, or several in turn (each formatted
once at start-up, so a request costs wrk a table lookup, not a format). `parse_report`
reads the text wrk prints with `--latency`: requests, req/s, the 50th and 99th percentile
latencies, and the errors it counts (responses with a status of 400 or more, and socket
errors: connect, read, write, timeout).

Failure policy: a report without a figure the benchmark needs (wrk stopped, or a run
that completed no request) gives None for that figure rather than raising; `errors`
counts every failure wrk reported, so a caller flags the run instead of trusting it.
"""

from __future__ import annotations

import re
import subprocess

LATENCY_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
SOCKET_ERRORS = ("connect", "read", "write", "timeout")
# Lua long brackets hold any body that does not contain their closing token.
LONG_OPEN, LONG_CLOSE = "[==[", "]==]"


def post_script(bodies: list[str]) -> str:
    """A wrk Lua script that POSTs `bodies` (JSON text) in turn, one per request."""
    if not bodies:
        raise ValueError("post_script needs at least one body")
    if any(LONG_CLOSE in body for body in bodies):
        raise ValueError(f"a body contains {LONG_CLOSE!r}, which would end its Lua string")
    head = 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
    if len(bodies) == 1:
        return head + f"wrk.body = {LONG_OPEN}{bodies[0]}{LONG_CLOSE}\n"
    listed = ",\n".join(f"  {LONG_OPEN}{body}{LONG_CLOSE}" for body in bodies)
    return (
        head
        + f"local bodies = {{\n{listed}\n}}\n"
        + "local requests = {}\n"
        + "local sent = 0\n"
        + "function init(args)\n"
        + "  for i, body in ipairs(bodies) do requests[i] = wrk.format(nil, nil, nil, body) end\n"
        + "end\n"
        + "function request()\n"
        + "  sent = sent % #requests + 1\n"
        + "  return requests[sent]\n"
        + "end\n"
    )


def wrk_argv(url: str, connections: int, seconds: int, script: str, cpus: str, threads: int = 1) -> list[str]:
    """wrk pinned to `cpus` (a taskset list), with the latency distribution on; wrk reads
    whole seconds only ("-d0.5s" is refused)."""
    if seconds != int(seconds) or seconds < 1:
        raise ValueError(f"wrk runs for whole seconds, not {seconds}")
    return [
        "taskset",
        "-c",
        cpus,
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{int(seconds)}s",
        "--latency",
        "-s",
        script,
        url,
    ]


def latency_ms(report: str, percentile: str) -> float | None:
    """One line of wrk's latency distribution ("     99%   11.47ms") in milliseconds."""
    match = re.search(rf"^\s+{re.escape(percentile)}%\s+([\d.]+)(us|ms|s|m|h)\s*$", report, re.M)
    return float(match.group(1)) * LATENCY_UNITS_MS[match.group(2)] if match else None


def parse_report(report: str) -> dict:
    """wrk's `--latency` report as numbers; `errors` sums non-2xx/3xx and socket errors."""
    requests = re.search(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h)", report, re.M)
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", report, re.M)
    refused = re.search(r"Non-2xx or 3xx responses: (\d+)", report)
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", report)
    non_2xx = int(refused.group(1)) if refused else 0
    socket_errors = dict(zip(SOCKET_ERRORS, map(int, sockets.groups()))) if sockets else dict.fromkeys(SOCKET_ERRORS, 0)
    return {
        "requests": int(requests.group(1)) if requests else None,
        "duration_s": float(requests.group(2)) * LATENCY_UNITS_MS[requests.group(3)] / 1e3 if requests else None,
        "rps": float(rate.group(1)) if rate else None,
        "p50_ms": latency_ms(report, "50"),
        "p99_ms": latency_ms(report, "99"),
        "non_2xx": non_2xx,
        "socket_errors": socket_errors,
        "errors": non_2xx + sum(socket_errors.values()),
    }


def run_wrk(url: str, connections: int, seconds: int, script: str, cpus: str = "1") -> dict:
    """One wrk run; its parsed report, with the connections and the raw text."""
    completed = subprocess.run(
        wrk_argv(url, connections, seconds, script, cpus), capture_output=True, text=True, check=True
    )
    return {"connections": connections, **parse_report(completed.stdout), "report": completed.stdout}
