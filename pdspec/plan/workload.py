"""Workloads for the fleet model: requests, each an arrival time, prompt tokens (ISL) and
output tokens (OSL).

Contract: `poisson(rate, count, shapes, seed)` is a pure function of its arguments. The
arrivals are a Poisson process at `rate` requests per second from time 0, and each
request's (ISL, OSL) pair is drawn uniformly from `shapes` (one shape: fixed lengths;
pairs rather than two lists, so a workload file's long prompts keep their own output
lengths). The gaps are drawn at unit rate and divided by `rate`, so for one seed two rates
give the same requests, only closer together: the planner's bisection over the rate
compares like with like.

`load(path)` reads a workload file: a JSON list of `{"arrival_s", "isl", "osl"}` objects.
Failure policy: a file that is not one (not JSON, an unknown key, a length below 1, an
empty list) is refused whole with `WorkloadError` naming the file, never half-read.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError


class WorkloadError(ValueError):
    """A file that is not a usable workload."""


@dataclass(frozen=True)
class Request:
    __pydantic_config__ = ConfigDict(extra="forbid")

    arrival_s: Annotated[float, Field(ge=0)]
    isl: Annotated[int, Field(ge=1)]  # prompt tokens
    osl: Annotated[int, Field(ge=1)]  # output tokens


_FILE = TypeAdapter(Annotated[list[Request], Field(min_length=1)])


def poisson(rate: float, count: int, shapes: Sequence[tuple[int, int]], seed: int) -> list[Request]:
    """`count` requests arriving at `rate` per second, their (ISL, OSL) drawn from `shapes`."""
    if rate <= 0 or count < 1 or not shapes:
        raise ValueError(f"a workload needs a rate > 0, a count >= 1 and a shape (got {rate}, {count}, {shapes})")
    draw = random.Random(seed)
    requests, clock = [], 0.0
    for _ in range(count):
        clock += draw.expovariate(1.0)
        isl, osl = shapes[draw.randrange(len(shapes))]
        requests.append(Request(arrival_s=clock / rate, isl=isl, osl=osl))
    return requests


def load(path: Path) -> list[Request]:
    """The requests in `path`, in arrival order; WorkloadError, naming the file, for anything else."""
    try:
        requests = _FILE.validate_json(Path(path).read_bytes())
    except (OSError, ValidationError) as exc:
        raise WorkloadError(f"{path}: not a workload (a JSON list of {{arrival_s, isl, osl}}): {exc}") from exc
    return sorted(requests, key=lambda request: request.arrival_s)


def shapes_of(requests: Sequence[Request]) -> list[tuple[int, int]]:
    """The (ISL, OSL) pairs of `requests`, one per request, for `poisson`."""
    return [(request.isl, request.osl) for request in requests]
