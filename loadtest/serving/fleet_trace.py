"""The fleet benchmark's traces: seeded, written to disk, the same requests for every policy.

Two workloads, both as token-id prompts (exact sizes, no tokenizer in the way):
- `shared_context`, shaped like llm-d's prefix benchmark: `tenants` tenants, each with a
  long context of its own (`context` tokens: documents, a system prompt), and short
  queries (`question` tokens) after it; each request picks a tenant uniformly (optionally
  after one `system` prefix common to all); arrivals are a Poisson process per level.
- `multi_turn`: chat sessions; a session's first prompt is `start` tokens, each later
  turn re-sends the history plus a stand-in for the previous answer (`answer` tokens) and
  a new message (`message` tokens). Sessions start as a Poisson process per level, at
  the level's QPS over `turns` (so turns arrive at about the level's QPS); a session's
  next turn leaves `think_s` (exponential mean) after its previous reply ended.
The answer's stand-in is fixed in the trace, not the model's own output, so every policy
sends the same prompts (the workers cache the generated tokens, which no later prompt
then matches: alike for every policy).

A trace is phases in order: one unmeasured `warmup` (fills the caches so the levels start
from a steady state, not from empty caches), then one phase per QPS level. Each request
says when it arrives (seconds after its phase starts) or, for a later turn, which request
it follows and after how long a pause.

On disk (`write_trace`, gzipped JSON): the settings, the token-id segments once each
(a tenant's context, a query, a session's pieces), and each request as the names of its
segments; `read_trace` gives the same `Trace` back (`Trace.prompt`).

Failure policy: bad settings raise ValueError here, before anything is sent.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

# Low ids are often control or byte tokens; no prompt needs them.
FIRST_TOKEN_ID = 10
WORKLOADS = ("shared_context", "multi_turn")


@dataclass(frozen=True)
class TraceRequest:
    id: int
    phase: str  # "warmup" or "level-<i>"
    qps: float  # the phase's offered rate
    segments: tuple[str, ...]  # the prompt, as names of Trace.segments in order
    max_tokens: int
    group: int  # the tenant (shared_context) or the session (multi_turn)
    turn: int = 0
    at_s: float = 0.0  # arrival, seconds after the phase started (first turns and shared_context)
    after: int | None = None  # a later turn: the id of the request it follows
    think_s: float = 0.0  # a later turn: the pause after `after`'s reply ended


@dataclass
class Trace:
    workload: str
    settings: dict
    segments: dict[str, list[int]]
    requests: list[TraceRequest]
    levels: list[float] = field(default_factory=list)  # each measured phase's QPS, in order
    name: str = ""  # what results call it (two traces of one workload apart); empty: the workload

    def __post_init__(self) -> None:
        self.name = self.name or self.workload

    def prompt(self, request: TraceRequest) -> list[int]:
        return [token for name in request.segments for token in self.segments[name]]

    def phases(self) -> list[str]:
        return list(dict.fromkeys(r.phase for r in self.requests))

    def phase(self, name: str) -> list[TraceRequest]:
        return [r for r in self.requests if r.phase == name]

    def prompt_tokens(self, requests: list[TraceRequest] | None = None) -> int:
        return sum(sum(len(self.segments[n]) for n in r.segments) for r in (requests or self.requests))


def _ids(rng: np.random.Generator, count: int, vocab: int) -> list[int]:
    return rng.integers(FIRST_TOKEN_ID, vocab, size=count).tolist()


def _check_levels(levels: list[tuple[float, float]]) -> None:
    if not levels or any(qps <= 0 or duration <= 0 for qps, duration in levels):
        raise ValueError(f"levels must be (qps > 0, duration_s > 0) pairs, got {levels!r}")


def _arrivals(rng: np.random.Generator, qps: float, duration_s: float) -> list[float]:
    """A Poisson process of `qps` over `duration_s`: its arrival times (at least one)."""
    times, now = [], 0.0
    while True:
        now += float(rng.exponential(1.0 / qps))
        if now >= duration_s:
            return times or [0.0]
        times.append(now)


def shared_context(
    seed: int,
    tenants: int,
    context: int,
    question: int,
    max_tokens: int,
    levels: list[tuple[float, float]],
    warmup_requests: int,
    warmup_qps: float,
    vocab: int,
    system: int = 0,
) -> Trace:
    """`tenants` contexts of `context` tokens (after a common `system` prefix, 0: none),
    queries of `question` tokens; `warmup_requests` at `warmup_qps`, then each (qps,
    duration_s) level of `levels`. Tenants are drawn uniformly per request."""
    _check_levels(levels)
    if min(tenants, context, question, max_tokens, warmup_qps) <= 0 or warmup_requests < 0 or system < 0:
        raise ValueError("tenants, context, question, max_tokens and warmup_qps must be positive")
    rng = np.random.default_rng(seed)
    segments: dict[str, list[int]] = {}
    prefix: tuple[str, ...] = ()
    if system:
        segments["system"] = _ids(rng, system, vocab)
        prefix = ("system",)
    for t in range(tenants):
        segments[f"ctx/{t}"] = _ids(rng, context, vocab)
    requests: list[TraceRequest] = []

    def add(phase: str, qps: float, times: list[float]) -> None:
        for at in times:
            i = len(requests)
            tenant = int(rng.integers(tenants))
            segments[f"q/{i}"] = _ids(rng, question, vocab)
            requests.append(
                TraceRequest(i, phase, qps, (*prefix, f"ctx/{tenant}", f"q/{i}"), max_tokens, tenant, at_s=round(at, 6))
            )

    if warmup_requests:
        add("warmup", warmup_qps, [k / warmup_qps for k in range(warmup_requests)])
    for index, (qps, duration) in enumerate(levels):
        add(f"level-{index}", qps, _arrivals(rng, qps, duration))
    settings = {
        "seed": seed,
        "tenants": tenants,
        "context": context,
        "question": question,
        "system": system,
        "max_tokens": max_tokens,
        "levels": [list(level) for level in levels],
        "warmup_requests": warmup_requests,
        "warmup_qps": warmup_qps,
        "vocab": vocab,
    }
    return Trace("shared_context", settings, segments, requests, [qps for qps, _ in levels])


def multi_turn(
    seed: int,
    turns: int,
    start: int,
    answer: int,
    message: int,
    max_tokens: int,
    think_s: float,
    levels: list[tuple[float, float]],
    warmup_sessions: int,
    vocab: int,
) -> Trace:
    """Sessions of `turns` turns (first prompt `start` tokens; each next one adds `answer`
    + `message` tokens), starting at each level's QPS / `turns` over its duration;
    `warmup_sessions` first, all at once."""
    _check_levels(levels)
    if min(turns, start, max_tokens) <= 0 or min(answer, message, think_s, warmup_sessions) < 0:
        raise ValueError("turns, start and max_tokens must be positive; answer, message, think_s, warmup >= 0")
    rng = np.random.default_rng(seed)
    segments: dict[str, list[int]] = {}
    requests: list[TraceRequest] = []
    session = 0

    def add(phase: str, qps: float, starts: list[float]) -> None:
        nonlocal session
        for at in starts:
            s, session = session, session + 1
            history: tuple[str, ...] = (f"s/{s}/start",)
            segments[history[0]] = _ids(rng, start, vocab)
            previous = None
            for turn in range(turns):
                if turn:
                    segments[f"s/{s}/a{turn}"] = _ids(rng, answer, vocab)
                    segments[f"s/{s}/m{turn}"] = _ids(rng, message, vocab)
                    history = (*history, f"s/{s}/a{turn}", f"s/{s}/m{turn}")
                i = len(requests)
                think = round(float(rng.exponential(think_s)), 6) if turn and think_s else 0.0
                requests.append(
                    TraceRequest(
                        i,
                        phase,
                        qps,
                        history,
                        max_tokens,
                        s,
                        turn,
                        at_s=round(at, 6) if turn == 0 else 0.0,
                        after=previous,
                        think_s=think,
                    )
                )
                previous = i

    if warmup_sessions:
        add("warmup", 0.0, [0.0] * warmup_sessions)
    for index, (qps, duration) in enumerate(levels):
        add(f"level-{index}", qps, _arrivals(rng, qps / turns, duration))
    settings = {
        "seed": seed,
        "turns": turns,
        "start": start,
        "answer": answer,
        "message": message,
        "max_tokens": max_tokens,
        "think_s": think_s,
        "levels": [list(level) for level in levels],
        "warmup_sessions": warmup_sessions,
        "vocab": vocab,
    }
    return Trace("multi_turn", settings, segments, requests, [qps for qps, _ in levels])


def write_trace(trace: Trace, path: Path) -> None:
    data = {
        "workload": trace.workload,
        "name": trace.name,
        "settings": trace.settings,
        "levels": trace.levels,
        "segments": trace.segments,
        "requests": [asdict(r) for r in trace.requests],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as out:
        json.dump(data, out, separators=(",", ":"))


def read_trace(path: Path) -> Trace:
    with gzip.open(path, "rt") as source:
        data = json.load(source)
    requests = [TraceRequest(**{**r, "segments": tuple(r["segments"])}) for r in data["requests"]]
    return Trace(data["workload"], data["settings"], data["segments"], requests, data["levels"], data.get("name", ""))


def parse_levels(spec: str) -> list[tuple[float, float]]:
    """'1x8,2x8,4x6' -> [(1.0, 8.0), (2.0, 8.0), (4.0, 6.0)]: QPS x seconds, in order."""
    levels = []
    for item in spec.split(","):
        qps, sep, duration = item.strip().partition("x")
        if not sep:
            raise ValueError(f"level {item!r}: expected QPSxSECONDS")
        levels.append((float(qps), float(duration)))
    _check_levels(levels)
    return levels


def main(argv: list[str] | None = None) -> Path:
    """`python -m loadtest.fleet_trace WORKLOAD --out FILE [settings]`: one trace, written."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m loadtest.fleet_trace", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--out", type=Path, required=True, help="the trace file (.json.gz)")
    parser.add_argument("--name", default="", help="what the results call this trace (default: the workload)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=4096, help="token ids are drawn below this")
    parser.add_argument("--levels", default="1x8,2x8,4x7,6x6,8x5,11x4", help="QPSxSECONDS,... in order")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--tenants", type=int, default=96, help="shared_context")
    parser.add_argument("--context", type=int, default=4096, help="shared_context: a tenant's context, in tokens")
    parser.add_argument("--question", type=int, default=256, help="shared_context: a query, in tokens")
    parser.add_argument("--system", type=int, default=0, help="shared_context: one prefix common to all (tokens)")
    parser.add_argument("--warmup-requests", type=int, default=48, help="shared_context")
    parser.add_argument("--warmup-qps", type=float, default=8.0, help="shared_context")
    parser.add_argument("--turns", type=int, default=4, help="multi_turn")
    parser.add_argument("--start", type=int, default=2048, help="multi_turn: the first prompt, in tokens")
    parser.add_argument("--answer", type=int, default=128, help="multi_turn: the stand-in for an answer, in tokens")
    parser.add_argument("--message", type=int, default=256, help="multi_turn: a new message, in tokens")
    parser.add_argument("--think-s", type=float, default=0.5, help="multi_turn: mean pause between turns")
    parser.add_argument("--warmup-sessions", type=int, default=8, help="multi_turn")
    args = parser.parse_args(argv)
    levels = parse_levels(args.levels)
    if args.workload == "shared_context":
        trace = shared_context(
            args.seed,
            args.tenants,
            args.context,
            args.question,
            args.max_tokens,
            levels,
            args.warmup_requests,
            args.warmup_qps,
            args.vocab,
            args.system,
        )
    else:
        trace = multi_turn(
            args.seed,
            args.turns,
            args.start,
            args.answer,
            args.message,
            args.max_tokens,
            args.think_s,
            levels,
            args.warmup_sessions,
            args.vocab,
        )
    trace.name = args.name or trace.workload
    write_trace(trace, args.out)
    print(
        f"{args.out}: {trace.name} ({trace.workload}), {len(trace.requests)} requests, {trace.prompt_tokens():,} prompt tokens"
    )
    return args.out


if __name__ == "__main__":
    main()
