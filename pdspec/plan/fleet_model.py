"""A discrete-event model of a serving fleet (SimPy): the TTFT, TPOT and goodput a layout of
engines gives a workload, from an engine profile's measured step times.

A layout is aggregated (G colocated engines, each prefilling and decoding) or
disaggregated (P prefill engines, D decode engines), its engines on one device each or
sharing fewer devices (`Layout.devices`). The model's assumptions:

- **Prefill engine**: FCFS. Each step takes up to `prefill.max_num_batched_tokens` prompt
  tokens from the head of its queue (chunked prefill: a long prompt spans steps, short ones
  share a step) and lasts `prefill.step_ms.at(tokens in the step)`. A request's prefill ends
  with the step that computes its last prompt token; the KV hand-off then takes
  `transfer_ms.at(ISL)` (hand-offs run side by side: no link is shared or saturated), and
  the request joins the decode engine picked when its prefill ended.
- **Decode engine**: continuous batching. Requests join at a step boundary, FCFS (one that
  does not fit holds back those behind it), while the batch is under `max_num_seqs` and the
  KV room allows: a request reserves ISL + OSL tokens of `kv_tokens` from joining until it
  ends (its whole footprint at once, so nothing is ever preempted or recomputed); a request
  bigger than the whole KV runs when the engine is empty, alone. A step of B requests lasts
  `decode[K].step_ms.at(B)` and each request gains `decode[K].tokens_per_step` tokens (the
  profile's mean acceptance, the same for every request and step), so a request ends after
  ceil(OSL / tokens_per_step) steps; its first token comes at the end of its first step.
- **Colocated engine** (vLLM's chunked prefill): each step runs the decode batch plus
  prompt tokens, FCFS, up to `max_num_batched_tokens - B * (1 + K)` (vLLM charges each
  decoding request its token and its K drafts against the step's budget). A step with both
  lasts `decode[K].step_ms.at(B) + prefill.step_ms.at(chunk) - prefill.step_ms.intercept()`:
  the fixed cost of a step (weights read, launch) is counted once, the prefill curve's first
  segment extended to zero tokens standing for it. A request is admitted (KV reserved as above) before its
  prefill starts; the step that computes its last prompt token emits its first token at its
  end, and it decodes from the next step on (no hand-off): ceil((OSL - 1) /
  tokens_per_step) more steps.
- **Routing**: a request goes to the prefill engine with the fewest outstanding prompt
  tokens; its decode engine is the one with the fewest outstanding requests (waiting, in
  hand-off or decoding); a colocated engine, the one with the fewest outstanding requests.
  Ties go to the lowest-numbered engine. An engine plans a step when it starts: a request
  arriving while it runs (or at the instant it starts, after it) waits for the next one.
- **Conditional disaggregation** (`Layout.conditional`, a disaggregated layout only): the
  proxy's rule as pdspec runs it by default (`proxy.routing`, docs/proxy.md), decided when a
  request arrives, in the proxy's order. (1) The length rule: a prompt of fewer than
  `local_prefill_max_tokens` tokens is served whole by the decode engine routing picks (the
  model has no prefix cache: every prompt is uncached). (2) decode_full: when every decode
  engine is full (the prompt tokens of the requests it serves, counted from their hand-off,
  plus this prompt exceed `decode_full_share` of its KV) or, with `counts_pending`, the decode
  pool's room (that share of each one's KV less what it holds, summed) less the prompts of the
  requests planned disaggregated and not yet handed off is short of the prompt, the prefill
  engine with the most room (its KV less the prompts of its legs in prefill and of the
  requests it serves whole; a tie to the one with fewer legs in flight) serves it whole, if
  one has room for it within `decode_full_prefill_share`. (3) The queue rule (`queue_rule`, the
  proxy's local_prefill_on_queue with a kv_aware prefill pool): when every prefill engine has
  a leg in flight (whole requests count as legs, as in the proxy) and the pool's work ahead
  (the least over its engines of the prompt, the prompts of its legs until their hand-off and
  of its whole requests until their first token, and `load_tokens` a leg in flight; plus one
  more `load_tokens`) exceeds the picked decode engine's (the prompt plus its own whole
  requests' prompts until their first token) by more than `local_prefill_max_tokens`, the
  decode engine serves it whole. `local_prefill_max_tokens` 0 turns both (1) and (3) off, as
  in the proxy. Else it is disaggregated: its leg goes to the prefill engine with the least
  outstanding prompt tokens plus `load_tokens` a leg in flight (so an engine decoding whole
  requests is not taken for idle, as kv_aware's load would not). An engine that serves
  requests whole runs as a colocated one (its steps mix a prompt chunk with its decode batch;
  a whole request reserves its ISL + OSL when admitted); a prefill engine's legs still
  reserve no KV. The rule counts prompt tokens against the KV size, as the proxy does, while
  the engines reserve ISL + OSL up front where vLLM admits on a prompt's blocks: a request
  the rule sent whole to an engine with room for its prompt may wait there for its output's
  room too. A request served whole gets the aggregated serving term (one leg), the others
  the disaggregated one.
- **Devices**: the profile's step times are an engine's alone on its device. Engines sharing a
  device (engine i of the layout, counting prefill, then decode, then colocated engines, is on
  device i mod `devices`, or where `Layout.device_of` says) share it by processor sharing with
  one measured parameter, the profile's `device_sharing.alpha` (1 without one; the demand and
  prefill forms below are the others): a step starts when its engine plans it, and while m steps run at
  once on the device each progresses at 1 / (1 + alpha * (m - 1)) of its speed alone, so a step of t ms that shares the device
  throughout with m - 1 others lasts t * (1 + alpha * (m - 1)). alpha = 1 splits the device's
  time between the steps on it (the device's throughput is that of one engine however many
  share it); alpha < 1 lets them overlap (an H200 running several eager engines: an eager
  step at small batch is launch-bound and leaves the GPU mostly idle for another's kernels);
  alpha > 1 makes them thrash (vLLM CPU engines on one core: each engine's threads bound to
  it, its processes polling, caches evicted by the other); alpha = 0 is a device per engine.
  Processor sharing, not turns at whole steps, because both a CPU core's scheduler and a
  GPU's time slicing between contexts switch every few milliseconds, well inside a step. Its
  limits: one alpha for every pair of steps (a prefill step beside a decode step slows it as
  much as another decode step does), a device's contention counted only in steps (an idle
  engine that polls costs nothing here), linear in m where real overlap saturates; each
  engine keeps the profile's `kv_tokens` (a profile for a shared GPU must be measured at the
  memory share each engine gets there). An engine alone on its device runs every step at its
  profiled time, whatever alpha, so a layout of one engine per device runs exactly as before
  devices were modelled.
- **Devices, the demand form** (`device_sharing.form` "demand", parameter `decode_demand` c,
  0 to 1): the alpha form's one number cannot tell a compute-bound prefill step (two of them
  cannot together run faster than the device runs one) from a memory- and launch-bound decode
  step (several overlap almost freely). In this form each running prefill step demands the
  whole device (1) and each running decode step c of it, and while steps run at once every one
  progresses at 1 / max(1, prefill steps + c * decode steps) of its speed alone: still one
  stretch for all the steps on the device, so the device's bookkeeping above is unchanged.
  A prefill engine's step is a prefill step and a decode engine's a decode step; a colocated
  engine's step is a prefill step when it computes prompt tokens (a chunk, with or without a
  decode batch beside it: its cost is mostly the chunk's) and a decode step otherwise. c is at
  most 1 (`DeviceSharing` refuses more), so a step alone on its device is never slowed. Its
  limits: a prefill step's demand is 1 whatever its chunk (a small chunk leaves room the
  model does not give), and a mixed colocated step counts as all prefill.
- **Devices, the prefill form** (`device_sharing.form` "prefill", parameter `prefill_alpha`):
  only prefill steps are slowed, by max(1 + prefill_alpha * (m - 1), p) while m steps run at
  once, p of them prefill steps (every kind counted in m; compute-bound prefill steps cannot
  together outrun the device, so p of them take at least p times as long); decode steps run at
  their profiled time whatever shares the device. What the H200 showed with two eager engines
  on it (a launch-bound decode step leaves the device mostly idle and is not delayed by a
  prefill beside it; the prefill loses the device time the decode kernels take;
  loadtest/results/plan/check-h200-1p1d-r2/). Prefill and colocated steps are told apart as in
  the demand form; the two kinds keep their own clocks. Its limits: decode steps never slow
  each other either (many decode engines on one device would), a mixed colocated step is
  stretched whole, and the slowdown is linear in m where the H200 fleet's fit says it grows
  faster (0.38 from two engines, 1.5 fitted on four).
- **Serving**: a request's time outside the engines (HTTP servers, the proxy, the legs' round
  trips), the profile's `serving_ms` for the layout's kind (0 without one), is added to its
  first token and its end (in conditional mode, the aggregated term for a request served
  whole): a constant that shifts TTFT, loads no engine and leaves TPOT as it is. It was measured on an idle stack, so any growth of it under load (API servers sharing
  the engines' cores, say) is not in it.
- **Out of scope** in this version: prefix caching (every prompt is computed in full), the
  kv_aware pick itself (routing is by the loads above, in conditional mode too),
  preemption, a prefill engine's KV for its legs (it holds a prompt's KV until the hand-off;
  not counted here: only the requests it serves whole take its KV), per-request acceptance
  variance, network contention.

TTFT is the first token's time minus the arrival; TPOT is (end - first token) / (OSL - 1),
None for OSL 1. Utilization is the fraction of a role's engine time spent in steps (a decode
engine steps whenever it holds a request, so its utilization says busy, not full; a step
slowed by sharing a device counts in full, so engines sharing one can together exceed it).

Contract: `simulate` is deterministic (a pure function of its arguments) and every request
finishes: queues are unbounded and nothing is refused or timed out, so an overloaded fleet
shows as growing TTFT, not as lost requests. Failure policy: a K the profile has no decode
curve for, a layout that is neither kind, or a layout's devices outside 1 to its engine count,
or conditional disaggregation on an aggregated layout, raises ValueError before anything runs
(a negative alpha or decode demand, or a decode demand over 1, cannot reach it: the profile
refuses one, `EngineProfile.with_sharing` and `DeviceSharing`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import simpy

from pdspec.plan.profile import Curve, DeviceSharing, EngineProfile
from pdspec.plan.workload import Request

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default for a GPU engine


@dataclass(frozen=True)
class Conditional:
    """Conditional disaggregation's rule, as the module docstring says; the defaults are the
    proxy's (`pdspec.settings.RoutingSettings`: local_prefill_max_tokens, local_prefill_on_queue,
    decode_on_prefill_when_full, decode_full_share, decode_full_prefill_share,
    decode_full_counts_pending, kv_aware_load_tokens)."""

    local_prefill_max_tokens: int = 512
    queue_rule: bool = True
    decode_full: bool = True
    decode_full_share: float = 1.0
    decode_full_prefill_share: float = 1.0
    counts_pending: bool = True
    load_tokens: int = 256


@dataclass(frozen=True)
class Layout:
    """Aggregated: `colocated` engines; disaggregated: `prefill` and `decode` engines. Their
    `devices`: None (the default) is one per engine, and reads back as the engine count; fewer
    put the engines on them round robin (`placement`), sharing each as the module docstring says.
    `device_of`: each engine's device instead (the prefill engines first, then decode, then
    colocated), for a measured stack placed otherwise (pdspec's CPU stacks pin every prefill
    worker to one core and every decode worker to the other); it sets `devices` to the
    devices it names, which must be 0 to devices - 1, each used. `conditional`: a
    disaggregated layout routes by conditional disaggregation's rule (the module docstring),
    as pdspec's proxy runs one with `routing.disaggregation = "conditional"`."""

    prefill: int = 0
    decode: int = 0
    colocated: int = 0
    devices: int | None = None
    device_of: tuple[int, ...] | None = None
    conditional: Conditional | None = None

    def __post_init__(self) -> None:
        aggregated = self.colocated >= 1 and self.prefill == self.decode == 0
        disaggregated = self.colocated == 0 and self.prefill >= 1 and self.decode >= 1
        if not (aggregated or disaggregated):
            raise ValueError(f"a layout is G >= 1 colocated engines or P >= 1 prefill + D >= 1 decode, got {self!r}")
        if aggregated and self.conditional is not None:
            raise ValueError("conditional disaggregation needs a disaggregated layout")
        if self.device_of is not None:
            used = set(self.device_of)
            if len(self.device_of) != self.engines or used != set(range(len(used))):
                raise ValueError(
                    f"device_of names each of the {self.engines} engines' devices, numbered from 0 with none skipped, "
                    f"got {self.device_of}"
                )
            if self.devices not in (None, len(used)):
                raise ValueError(f"device_of uses {len(used)} devices, devices says {self.devices}")
            object.__setattr__(self, "devices", len(used))
        if self.devices is None:
            # Normalized so that one engine per device is one layout however it was written.
            object.__setattr__(self, "devices", self.engines)
        elif not 1 <= self.devices <= self.engines:
            raise ValueError(f"{self.engines} engines go on 1 to {self.engines} devices, got devices={self.devices}")

    @classmethod
    def aggregated(cls, engines: int, devices: int | None = None, device_of: tuple[int, ...] | None = None) -> Layout:
        return cls(colocated=engines, devices=devices, device_of=device_of)

    @classmethod
    def disaggregated(
        cls,
        prefill: int,
        decode: int,
        devices: int | None = None,
        device_of: tuple[int, ...] | None = None,
        conditional: Conditional | None = None,
    ) -> Layout:
        return cls(prefill=prefill, decode=decode, devices=devices, device_of=device_of, conditional=conditional)

    @property
    def is_aggregated(self) -> bool:
        return self.colocated > 0

    @property
    def engines(self) -> int:
        return self.prefill + self.decode + self.colocated

    @property
    def shares_devices(self) -> bool:
        return self.devices < self.engines

    @property
    def placement(self) -> tuple[int, ...]:
        """Each engine's device, the prefill engines listed first, then decode, then colocated:
        `device_of` when given, else round robin, so 2P:2D on 2 devices puts a prefill and a
        decode engine on each."""
        if self.device_of is not None:
            return self.device_of
        return tuple(engine % self.devices for engine in range(self.engines))

    def __str__(self) -> str:
        engines = f"aggregated x{self.colocated}" if self.is_aggregated else f"{self.prefill}P:{self.decode}D"
        if self.conditional is not None:
            engines += " conditional"
        if not self.shares_devices:
            return engines
        return f"{engines} on {self.devices} device" + ("s" if self.devices > 1 else "")


@dataclass(frozen=True)
class Slo:
    ttft_p90_ms: float
    tpot_p90_ms: float


@dataclass(frozen=True)
class Outcome:
    request: Request
    first_token_s: float
    end_s: float

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.request.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.request.osl == 1:
            return None
        return (self.end_s - self.first_token_s) / (self.request.osl - 1)

    def meets(self, slo: Slo) -> bool:
        """Both SLO thresholds, for this request alone (what goodput counts)."""
        tpot = self.tpot_s
        return self.ttft_s * 1000 <= slo.ttft_p90_ms and (tpot is None or tpot * 1000 <= slo.tpot_p90_ms)


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class Summary:
    count: int
    duration_s: float  # first arrival to last end
    throughput_rps: float
    ttft_ms: Percentiles
    tpot_ms: Percentiles  # over the requests with OSL > 1; zeros when there are none
    goodput_rps: float  # requests meeting both SLO thresholds, per second of duration_s
    attainment: float  # the fraction of requests meeting both thresholds
    utilization: dict[str, float]  # role -> fraction of its engines' time in steps

    def meets(self, slo: Slo) -> bool:
        return self.ttft_ms.p90 <= slo.ttft_p90_ms and self.tpot_ms.p90 <= slo.tpot_p90_ms


@dataclass(frozen=True)
class FleetRun:
    outcomes: list[Outcome]  # in arrival order
    steps: dict[str, list[tuple[float, float]]]  # role -> (start, end) of every step of its engines
    engines: dict[str, int]  # role -> engines
    # How each request was served, conditional mode only: "disaggregated", or served whole
    # with the proxy's reason ("short_prompt", "decode_full", "prefill_queue").
    routes: dict[str, int] = field(default_factory=dict)

    def summary(self, slo: Slo, measured: slice = slice(None)) -> Summary:
        """The figures of the requests `measured` picks, in arrival order (the planner leaves
        out the first ones, which met an emptier fleet, and the last ones, which decode while
        it drains): latency over them; throughput, goodput and utilization over the span from
        their first arrival to their last end."""
        outcomes = self.outcomes[measured]
        if not outcomes:
            raise ValueError(f"{measured} picks none of the {len(self.outcomes)} requests")
        start = min(outcome.request.arrival_s for outcome in outcomes)
        end = max(outcome.end_s for outcome in outcomes)
        duration = max(end - start, 1e-9)
        tpots = [outcome.tpot_s for outcome in outcomes if outcome.tpot_s is not None]
        meeting = sum(outcome.meets(slo) for outcome in outcomes)
        return Summary(
            count=len(outcomes),
            duration_s=duration,
            throughput_rps=len(outcomes) / duration,
            ttft_ms=percentiles([outcome.ttft_s * 1000 for outcome in outcomes]),
            tpot_ms=percentiles([tpot * 1000 for tpot in tpots]),
            goodput_rps=meeting / duration,
            attainment=meeting / len(outcomes),
            utilization={
                role: _busy_s(self.steps[role], start, end) / (count * duration) for role, count in self.engines.items()
            },
        )


def _busy_s(steps: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(step_end, end) - max(step_start, start)) for step_start, step_end in steps)


def percentiles(values: Sequence[float]) -> Percentiles:
    """p50, p90 and p99 of `values`, linear between ranks (numpy's default); zeros for none."""
    if not values:
        return Percentiles(0.0, 0.0, 0.0)
    ordered = sorted(values)

    def at(q: float) -> float:
        position = q * (len(ordered) - 1)
        low = math.floor(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return Percentiles(at(0.5), at(0.9), at(0.99))


def simulate(
    profile: EngineProfile,
    layout: Layout,
    k: int,
    requests: Sequence[Request],
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> FleetRun:
    """Run `requests` through `layout` with draft length `k`, until the last one ends."""
    if k not in profile.decode:
        raise ValueError(f"the profile has no decode curve for K={k} (it has K={sorted(profile.decode)})")
    if not requests:
        raise ValueError("a run needs at least one request")
    fleet = _Fleet(profile, layout, k, max_num_seqs)
    jobs = [_Job(request) for request in sorted(requests, key=lambda request: request.arrival_s)]
    fleet.env.process(fleet.arrivals(jobs))
    fleet.env.run()
    if any(job.end_s is None for job in jobs):  # the contract above: a bug, never a result
        raise RuntimeError("the fleet model stopped with requests unfinished")
    engines = fleet.engines()
    serving_ms = profile.serving_ms

    def serving_s(job: _Job) -> float:  # a request served whole took one leg: the aggregated term
        return serving_ms.for_layout(layout.is_aggregated or job.whole) / 1000 if serving_ms else 0.0

    return FleetRun(
        outcomes=[Outcome(job.request, job.first_token_s + serving_s(job), job.end_s + serving_s(job)) for job in jobs],
        steps={role: [step for engine in group for step in engine.step_times] for role, group in engines.items()},
        engines={role: len(group) for role, group in engines.items()},
        routes=dict(fleet.routes),
    )


class _Job:
    """A request's progress through the fleet."""

    __slots__ = ("request", "prefill_left", "first_token_s", "end_s", "whole")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.prefill_left = request.isl
        self.first_token_s: float | None = None
        self.end_s: float | None = None
        self.whole = False  # conditional mode: served whole (prefill and decode) by one engine


def _steps_to_generate(tokens: int, tokens_per_step: float) -> int:
    return max(1, math.ceil(tokens / tokens_per_step - 1e-9))  # 1e-9: 6 / 1.5 is 4 steps, not 5


def _take_chunk(queue: deque[_Job], budget: int) -> tuple[int, int]:
    """Prompt tokens for one step, FCFS from the head of `queue`, up to `budget`: (tokens
    taken, jobs whose prefill this step completes; they lead the queue)."""
    tokens = completed = 0
    for job in queue:
        if tokens == budget:
            break
        take = min(job.prefill_left, budget - tokens)
        job.prefill_left -= take
        tokens += take
        completed += job.prefill_left == 0
    return tokens, completed


class _Memo:
    """A curve's values by x, each computed once: steps repeat the same batch sizes and chunks."""

    def __init__(self, curve: Curve) -> None:
        self.curve, self.values = curve, {}

    def at(self, x: float) -> float:
        value = self.values.get(x)
        if value is None:
            value = self.values[x] = self.curve.at(x)
        return value


class _SharedDevice:
    """A device several engines' steps run on at once, processor-shared as the module
    docstring says. Kept in work done per step on a clock (`_work_ms`: the ms of its profiled
    time each running step on that clock has been given since the device was made), which
    grows at 1 / stretch per ms (the alpha form: 1 + alpha * (m - 1) while m steps run; the
    demand form: max(1, prefill steps + decode_demand * decode steps)): a step ends when its
    clock reaches the value it had at the step's start plus the step's profiled time, and the
    running steps of a clock end in that order (no per-step bookkeeping when m changes). The
    alpha and demand forms stretch every step alike, so all run on one clock; the prefill form
    stretches prefill steps only (max(1 + prefill_alpha * (m - 1), prefill steps)), so each
    kind has its own."""

    DONE_MS = 1e-6  # a step within a nanosecond of its work is done (float rounding)

    def __init__(self, env: simpy.Environment, sharing: DeviceSharing) -> None:
        self.env = env
        self.form = sharing.form
        self.value = sharing.value
        self._clocks = ("prefill", "decode") if self.form == "prefill" else ("all",)
        # per clock, a heap: (work done at its end, order, event, kind)
        self._running: dict[str, list[tuple[float, int, simpy.Event, str]]] = {clock: [] for clock in self._clocks}
        self._work_ms = dict.fromkeys(self._clocks, 0.0)
        self._order = itertools.count()  # ties end in the order they started
        self._prefills = 0  # running prefill steps (the demand form's count; the rest are decode)
        self._steps = 0  # running steps, every clock's
        self._since = 0.0  # when the clocks were last brought up to date
        self._timer = 0  # the pending timer's number: an older one firing is stale

    def run(self, step_ms: float, kind: str = "decode") -> simpy.Event:
        """A step of `step_ms` alone, of `kind` ("prefill" or "decode": what the demand and
        prefill forms read), started now; the event fires when it ends."""
        self._catch_up()
        done = self.env.event()
        clock = kind if self.form == "prefill" else "all"
        heapq.heappush(self._running[clock], (self._work_ms[clock] + step_ms, next(self._order), done, kind))
        self._prefills += kind == "prefill"
        self._steps += 1
        self._set_timer()
        return done

    def _stretch(self, clock: str) -> float:
        if self.form == "demand":
            return max(1.0, self._prefills + self.value * (self._steps - self._prefills))
        if self.form == "prefill":
            if clock == "decode":
                return 1.0
            # Compute-bound prefill steps cannot together outrun the device: at least the
            # number of them running.
            return max(1 + self.value * (self._steps - 1), float(self._prefills))
        return 1 + self.value * (self._steps - 1)

    def _catch_up(self) -> None:
        elapsed_ms = (self.env.now - self._since) * 1000
        for clock in self._clocks:
            if self._running[clock]:
                self._work_ms[clock] += elapsed_ms / self._stretch(clock)
        self._since = self.env.now

    def _set_timer(self) -> None:
        # SimPy cannot cancel a timeout: each change of m sets a new one, and the old ones
        # find their number stale when they fire.
        self._timer += 1
        lefts = [
            max(0.0, self._running[clock][0][0] - self._work_ms[clock]) * self._stretch(clock)
            for clock in self._clocks
            if self._running[clock]
        ]
        if not lefts:
            return
        timer = self._timer
        self.env.timeout(min(lefts) / 1000).callbacks.append(lambda _: self._on_timer(timer))

    def _on_timer(self, timer: int) -> None:
        if timer != self._timer:
            return
        self._catch_up()
        ended = []
        for clock in self._clocks:
            running = self._running[clock]
            while running and running[0][0] <= self._work_ms[clock] + self.DONE_MS:
                ended.append(heapq.heappop(running))
        if len(self._clocks) > 1:  # one clock's ended steps leave its heap in order; two clocks', by start
            ended.sort(key=lambda step: step[1])
        for _, _, done, kind in ended:
            self._prefills -= kind == "prefill"
            self._steps -= 1
            done.succeed()
        self._set_timer()


class _Engine:
    """One engine: steps back to back while it has work, sleeps on an event when it has none.
    `load` is what routing compares (its meaning is the role's)."""

    role = ""

    def __init__(self, fleet: _Fleet, device: _SharedDevice | None) -> None:
        """`device`: the device it shares with other engines; None when it has one to itself."""
        self.fleet, self.env, self.device = fleet, fleet.env, device
        self.load = 0
        self.step_times: list[tuple[float, float]] = []  # (start, end) of each step
        self._wake: simpy.Event | None = None
        self.env.process(self._run())

    def notify(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _run(self) -> Iterator[simpy.Event]:
        while True:
            step_ms = self._begin_step()
            if step_ms is None:
                self._wake = self.env.event()
                yield self._wake
                self._wake = None
                continue
            start = self.env.now
            if self.device is None:
                # A plain timeout, not a device of one: the device's events would reorder
                # same-instant events against the one-engine-per-device model.
                yield self.env.timeout(step_ms / 1000)
            else:
                yield self.device.run(step_ms, self._step_kind())
            self.step_times.append((start, self.env.now))
            self._end_step()

    def _begin_step(self) -> float | None:
        """Plan the next step; its duration in ms, or None when there is nothing to do."""
        raise NotImplementedError

    def _step_kind(self) -> str:
        """The planned step's kind for a shared device's demand and prefill forms: "prefill" or "decode"."""
        return self.role

    def _end_step(self) -> None:
        raise NotImplementedError


class _PrefillEngine(_Engine):
    role = "prefill"  # load: outstanding prompt tokens

    def __init__(self, fleet: _Fleet, device: _SharedDevice | None) -> None:
        super().__init__(fleet, device)
        self.queue: deque[_Job] = deque()
        self._chunk = self._completed = 0

    def submit(self, job: _Job) -> None:
        self.queue.append(job)
        self.load += job.request.isl
        self.notify()

    def _begin_step(self) -> float | None:
        if not self.queue:
            return None
        self._chunk, self._completed = _take_chunk(self.queue, self.fleet.profile.prefill.max_num_batched_tokens)
        return self.fleet.prefill_ms.at(self._chunk)

    def _end_step(self) -> None:
        self.load -= self._chunk
        for _ in range(self._completed):
            self.fleet.hand_off(self.queue.popleft())


class _BatchingEngine(_Engine):
    """What decode and colocated engines share: KV room, the batch, and steps counted so a
    request's end is known when it joins (O(1) per step, not O(batch))."""

    def __init__(self, fleet: _Fleet, device: _SharedDevice | None) -> None:
        super().__init__(fleet, device)
        self.waiting: deque[_Job] = deque()
        self.batch = 0  # requests decoding
        self.kv_used = 0
        self.steps = 0
        self.ending: defaultdict[int, list[_Job]] = defaultdict(list)
        self.decode_ms, self.tokens_per_step = fleet.decode_ms, fleet.profile.decode[fleet.k].tokens_per_step

    def submit(self, job: _Job) -> None:
        self.waiting.append(job)
        self.notify()

    def _admit(self, holding: int) -> Iterator[_Job]:
        """Waiting jobs, FCFS, that fit beside the `holding` requests the engine has."""
        while self.waiting and holding < self.fleet.max_num_seqs:
            need = self.waiting[0].request.isl + self.waiting[0].request.osl
            if holding and self.kv_used + need > self.fleet.profile.kv_tokens:
                return
            self.kv_used += need
            holding += 1
            yield self.waiting.popleft()

    def _decode_for(self, job: _Job, tokens: int) -> None:
        self.batch += 1
        self.ending[self.steps + _steps_to_generate(tokens, self.tokens_per_step)].append(job)

    def _finish_due(self) -> None:
        for job in self.ending.pop(self.steps, ()):
            self.batch -= 1
            self._finish(job)

    def _finish(self, job: _Job) -> None:
        job.end_s = self.env.now
        self.kv_used -= job.request.isl + job.request.osl
        self.load -= 1


class _DecodeEngine(_BatchingEngine):
    role = "decode"  # load: outstanding requests, counted from the hand-off's start

    def __init__(self, fleet: _Fleet, device: _SharedDevice | None) -> None:
        super().__init__(fleet, device)
        self._joined: list[_Job] = []

    def _begin_step(self) -> float | None:
        for job in self._admit(self.batch):
            self._decode_for(job, job.request.osl)
            self._joined.append(job)
        return self.decode_ms.at(self.batch) if self.batch else None

    def _end_step(self) -> None:
        self.steps += 1
        for job in self._joined:
            job.first_token_s = self.env.now
        self._joined = []
        self._finish_due()


class _ChunkingEngine(_BatchingEngine):
    """What colocated engines and the engines of a conditionally disaggregated layout share: a
    step that runs the decode batch and a prompt chunk (vLLM's chunked prefill, the module
    docstring's colocated engine), and a whole request's first token at the end of the step
    that computes its last prompt token."""

    def __init__(self, fleet: _Fleet, device: _SharedDevice | None) -> None:
        super().__init__(fleet, device)
        self._chunk = self._completed = 0

    def _chunked_step(self, prompts: deque[_Job]) -> float | None:
        """Plan a step of the batch and a chunk of `prompts` (FCFS, within the budget the batch
        leaves); its duration in ms, or None when there is nothing to do."""
        budget = max(0, self.fleet.profile.prefill.max_num_batched_tokens - self.batch * (1 + self.fleet.k))
        self._chunk, self._completed = _take_chunk(prompts, budget)
        prefill_ms = self.fleet.prefill_ms
        if not self._chunk:
            return self.decode_ms.at(self.batch) if self.batch else None
        if not self.batch:
            return prefill_ms.at(self._chunk)
        return self.decode_ms.at(self.batch) + prefill_ms.at(self._chunk) - self.fleet.prefill_fixed_ms

    def _step_kind(self) -> str:
        return "prefill" if self._chunk else "decode"  # a chunk of prompt makes it a prefill step

    def _first_token(self, job: _Job) -> None:
        """`job`'s prompt is computed: its first token now, then it decodes the rest here."""
        job.first_token_s = self.env.now
        if job.request.osl == 1:
            self._finish(job)
        else:
            self._decode_for(job, job.request.osl - 1)


class _ColocatedEngine(_ChunkingEngine):
    role = "colocated"  # load: outstanding requests

    def __init__(self, fleet: _Fleet, device: _SharedDevice | None) -> None:
        super().__init__(fleet, device)
        self.prefilling: deque[_Job] = deque()  # admitted, KV reserved

    def submit(self, job: _Job) -> None:
        self.load += 1
        super().submit(job)

    def _begin_step(self) -> float | None:
        self.prefilling.extend(self._admit(len(self.prefilling) + self.batch))
        return self._chunked_step(self.prefilling)

    def _end_step(self) -> None:
        self.steps += 1
        self._finish_due()
        for _ in range(self._completed):
            self._first_token(self.prefilling.popleft())


class _ServingEngine(_ChunkingEngine):
    """A prefill or decode engine of a conditionally disaggregated layout. It prefills legs and
    hands them off (a prefill engine's work), decodes handed-off requests (a decode engine's),
    and serves requests whole (either role's, as the rule sends them); each step is a colocated
    engine's: its decode batch and a prompt chunk, FCFS over its legs and its admitted whole
    requests. `load` is its role's, as the plain engines': outstanding prompt tokens (legs' and
    whole requests', until prefilled) on a prefill engine, outstanding requests on a decode
    engine. What the rule reads, the proxy's books: `leased` (the prompt tokens of its legs in
    prefill, of the requests it decodes from their hand-off, and of those it serves whole),
    `in_flight` (legs and whole requests not yet done: the proxy's legs in flight),
    `leg_prompt` (its legs' prompt tokens until their hand-off) and `local_prompt` (its whole
    requests' prompt tokens until their first token)."""

    def __init__(self, fleet: _Fleet, device: _SharedDevice | None, role: str) -> None:
        self.role = role
        super().__init__(fleet, device)
        self.prompts: deque[_Job] = deque()  # legs, and admitted whole requests, still to prefill
        self.prefilling_whole = 0  # whole requests in `prompts` (they hold KV; legs do not)
        self.leased = self.in_flight = self.local_prompt = self.leg_prompt = 0
        self._joined: list[_Job] = []

    def submit_leg(self, job: _Job) -> None:
        self.prompts.append(job)
        self.leased += job.request.isl
        self.leg_prompt += job.request.isl
        self.in_flight += 1
        self.load += job.request.isl
        self.notify()

    def submit_whole(self, job: _Job) -> None:
        job.whole = True
        self.leased += job.request.isl
        self.in_flight += 1
        self.local_prompt += job.request.isl
        self.load += job.request.isl if self.role == "prefill" else 1
        super().submit(job)

    def _begin_step(self) -> float | None:
        for job in self._admit(self.prefilling_whole + self.batch):
            if job.whole:
                self.prompts.append(job)
                self.prefilling_whole += 1
            else:  # handed off: its KV is here, it decodes from this step on
                self._decode_for(job, job.request.osl)
                self._joined.append(job)
        return self._chunked_step(self.prompts)

    def _end_step(self) -> None:
        self.steps += 1
        for job in self._joined:
            job.first_token_s = self.env.now
        self._joined = []
        self._finish_due()
        if self.role == "prefill":
            self.load -= self._chunk
        for _ in range(self._completed):
            job = self.prompts.popleft()
            if not job.whole:
                self.leased -= job.request.isl
                self.leg_prompt -= job.request.isl
                self.in_flight -= 1
                self.fleet.hand_off(job)
                continue
            self.prefilling_whole -= 1
            self.local_prompt -= job.request.isl
            self._first_token(job)

    def _finish(self, job: _Job) -> None:
        job.end_s = self.env.now
        self.kv_used -= job.request.isl + job.request.osl
        self.leased -= job.request.isl
        self.in_flight -= job.whole
        if self.role == "decode":
            self.load -= 1


class _Fleet:
    def __init__(self, profile: EngineProfile, layout: Layout, k: int, max_num_seqs: int) -> None:
        self.profile, self.k, self.max_num_seqs = profile, k, max_num_seqs
        conditional = self.conditional = layout.conditional
        self.pending = 0  # conditional mode: prompt tokens planned disaggregated, not yet handed off
        self.routes: Counter[str] = Counter()
        self.prefill_ms, self.transfer_ms = _Memo(profile.prefill.step_ms), _Memo(profile.transfer_ms)
        self.decode_ms = _Memo(profile.decode[k].step_ms)
        self.prefill_fixed_ms = profile.prefill.step_ms.intercept()  # a mixed step pays it once
        self.env = simpy.Environment()
        placement = layout.placement
        devices = [_SharedDevice(self.env, profile.sharing) for _ in range(layout.devices)]
        engines_on = Counter(placement)
        shared = iter(devices[device] if engines_on[device] > 1 else None for device in placement)
        # Built in `placement`'s order: the prefill engines, then decode, then colocated.
        if conditional is None:
            self.prefill = [_PrefillEngine(self, next(shared)) for _ in range(layout.prefill)]
            self.decode = [_DecodeEngine(self, next(shared)) for _ in range(layout.decode)]
        else:
            self.prefill = [_ServingEngine(self, next(shared), "prefill") for _ in range(layout.prefill)]
            self.decode = [_ServingEngine(self, next(shared), "decode") for _ in range(layout.decode)]
        self.colocated = [_ColocatedEngine(self, next(shared)) for _ in range(layout.colocated)]

    def engines(self) -> dict[str, list[_Engine]]:
        groups = {"prefill": self.prefill, "decode": self.decode, "colocated": self.colocated}
        return {role: group for role, group in groups.items() if group}

    def arrivals(self, jobs: list[_Job]) -> Iterator[simpy.Event]:
        for job in jobs:
            # max: two arrivals at one instant can differ by a rounding once `now` is a sum.
            yield self.env.timeout(max(0.0, job.request.arrival_s - self.env.now))
            if self.conditional is not None:
                self._route_conditional(job)
                continue
            engines = self.colocated or self.prefill
            min(engines, key=lambda engine: engine.load).submit(job)

    def _route_conditional(self, job: _Job) -> None:
        """The rule's three steps in the proxy's order (the module docstring), else a leg on
        the prefill engine with the least load."""
        rule, isl = self.conditional, job.request.isl
        local = rule.local_prefill_max_tokens > 0  # 0: never prefill on a decode engine, as in the proxy
        decode = min(self.decode, key=lambda engine: engine.load)
        if local and isl < rule.local_prefill_max_tokens:
            return self._serve_whole(decode, job, "short_prompt")
        if rule.decode_full and self._decode_full(isl):
            size = self.profile.kv_tokens * rule.decode_full_prefill_share
            # The most room, then the fewest legs in flight (the proxy's order), then the lowest-numbered.
            roomiest = max(self.prefill, key=lambda engine: (size - engine.leased, -engine.in_flight))
            if size - roomiest.leased >= isl:
                return self._serve_whole(roomiest, job, "decode_full")
        if local and rule.queue_rule and all(engine.in_flight for engine in self.prefill):
            ahead = min(
                engine.leg_prompt + engine.local_prompt + isl + rule.load_tokens * engine.in_flight
                for engine in self.prefill
            )
            if ahead + rule.load_tokens - (isl + decode.local_prompt) > rule.local_prefill_max_tokens:
                return self._serve_whole(decode, job, "prefill_queue")
        self.routes["disaggregated"] += 1
        self.pending += isl
        min(self.prefill, key=lambda engine: engine.load + rule.load_tokens * engine.in_flight).submit_leg(job)

    def _decode_full(self, isl: int) -> bool:
        """Every decode engine full for a prompt of `isl`, or (counting pending) the pool's room
        less the prompts planned to it short of it: the proxy's decode_full test."""
        rule = self.conditional
        size = self.profile.kv_tokens * rule.decode_full_share
        if all(engine.leased + isl > size for engine in self.decode):
            return True
        room = sum(max(0.0, size - engine.leased) for engine in self.decode)
        return rule.counts_pending and room - self.pending < isl

    def _serve_whole(self, engine: _ServingEngine, job: _Job, reason: str) -> None:
        self.routes[reason] += 1
        engine.submit_whole(job)

    def hand_off(self, job: _Job) -> None:
        engine = min(self.decode, key=lambda engine: engine.load)
        engine.load += 1
        if self.conditional is not None:  # the decode leg starts: its prompt counts there, no longer pending
            self.pending -= job.request.isl
            engine.leased += job.request.isl
        # A callback rather than a process per hand-off: a third of the events, same order.
        transfer = self.env.timeout(self.transfer_ms.at(job.request.isl) / 1000)
        transfer.callbacks.append(lambda _: engine.submit(job))
