"""Which layout of G engines and which draft length K serve a workload best under an SLO,
by the fleet model (`fleet_model.simulate`).

The candidates are every layout of `gpus` engines (one engine per GPU): aggregated G, and
every P:D split with P >= 1, D >= 1, P + D = G, always disaggregated and with conditional
disaggregation (`fleet_model.Conditional`, the proxy's rule: `pdspec.plan.routing` turns the
choice into the proxy's settings); each with every K the profile has a decode curve for. The model can put engines on fewer devices (`Layout.devices`, for validating
measured stacks that share them); the search does not: engines sharing a GPU slow each
other (the profile's device term), which no layout would choose over a GPU each, and the
profile's KV room is one engine's on a whole GPU. For each candidate the search finds the highest Poisson arrival rate at which
both the TTFT p90 and the TPOT p90 meet the SLO, and the goodput there: that rate times the
fraction of its requests meeting both thresholds one by one (steady state; a finite trial's
own requests per second, `Summary.goodput_rps`, would count the drain after its last
arrival against it, favouring whatever ends requests sooner). Candidates rank by goodput.

How a rate is found: a trial simulates Poisson arrivals at the rate (`workload.poisson`, the
same seed for every trial, so two rates see the same requests) and measures
`requests_per_trial` of them: those after a margin of as many requests as a loaded fleet
holds at that rate (rate times a request's time in it, by Little's law), and before as many
more, so the measured ones meet neither the empty fleet of the start nor the drain of the end.
The first trial runs at MAX_UTILIZATION (90%) of the candidate's throughput bound
(`throughput_bound`: what its engines can do at most; at the bound itself queues grow
without end); if that meets the SLO, it is the answer; else `bisection_steps` halvings of
[0, that rate] follow. The margins are capped at
MAX_MARGIN_TRIALS times the measured requests, which bounds a trial's cost.

What that costs in accuracy: a trial is still a finite run from an empty fleet. Near a
decode engine's full batch its batch settles more slowly than the margin allows (the time
constant grows with step(B) / step(1)), so there TPOT reads low and the rate found is a few
percent high (checked once, on a synthetic decode-bound case of 6 colocated engines: the
search found 5.48 req/s; over 12,000 requests 5.0 kept TPOT p90 under the SLO and 5.48
broke it after about 10,000); a rate just above what the fleet sustains can pass when the
backlog it builds stays short, which the bound caps. The cap is loose where the bound is: an
aggregated layout and a split with conditional disaggregation (bound as colocated engines)
can pass at 90% of it and not sustain it (8 H100 engines, ISL 4,352, OSL 48: 96.6 req/s
found, about 70 sustained over 4,000 requests), where a plain split's tighter bound holds.

Contract: deterministic (a pure function of its arguments; ties in goodput go to the
higher rate, then to a layout without conditional disaggregation, then the lower TPOT p90
and TTFT p90 there, then the layout and K listed first: two candidates held to one
throughput bound differ in latency only). Each candidate
that is not the best says why it loses: the threshold it breaks from which rate, against
the rate the best sustains; or, tied on goodput, its TPOT p90 against the best's.
Failure policy: `gpus` < 1, no shape, or a trial count below 1 raise ValueError; a
candidate that meets the SLO at no rate tried ranks last with goodput 0, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdspec.plan import workload
from pdspec.plan.fleet_model import DEFAULT_MAX_NUM_SEQS, Conditional, Layout, Slo, Summary, simulate
from pdspec.plan.profile import EngineProfile

DEFAULT_REQUESTS_PER_TRIAL = 200
DEFAULT_BISECTION_STEPS = 7  # the rate to within 1/128 of the throughput bound
MAX_MARGIN_TRIALS = 10  # requests before (and after) the measured ones: at most this many times theirs
MAX_UTILIZATION = 0.9  # the highest share of its throughput bound a candidate is planned at


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    k: int
    rate_rps: float  # the highest arrival rate found meeting both SLOs (0: none)
    summary: Summary | None  # at rate_rps
    limit: str  # what stops it above rate_rps

    @property
    def goodput_rps(self) -> float:
        return self.rate_rps * self.summary.attainment if self.summary else 0.0


@dataclass(frozen=True)
class Plan:
    ranked: list[Candidate]  # best first
    trials: int

    @property
    def best(self) -> Candidate:
        return self.ranked[0]

    def why_loses(self, candidate: Candidate) -> str:
        best = self.best
        if candidate.summary and candidate.goodput_rps == best.goodput_rps and candidate.rate_rps == best.rate_rps:
            if candidate.layout.conditional is not None and best.layout.conditional is None:
                return (
                    f"as much goodput as the best ({best.goodput_rps:.3g} req/s): conditional disaggregation adds "
                    "none, so the layout without it ranks first"
                )
            return (
                f"as much goodput as the best ({best.goodput_rps:.3g} req/s), at TPOT p90 "
                f"{milliseconds(candidate.summary.tpot_ms.p90)} against its {milliseconds(best.summary.tpot_ms.p90)}"
            )
        return (
            f"goodput {candidate.goodput_rps:.3g} against {best.goodput_rps:.3g} req/s: {candidate.limit}; "
            f"the best sustains {best.rate_rps:.3g} req/s"
        )


def layouts(gpus: int) -> list[Layout]:
    """Aggregated `gpus`, then every P:D split, P from 1 up, each always disaggregated and then
    with conditional disaggregation's rule as the proxy runs it by default (`plan` ranks a
    layout with the rule below any without it at the same goodput and rate)."""
    if gpus < 1:
        raise ValueError(f"a fleet needs at least one GPU, got {gpus}")
    splits = [
        layout
        for p in range(1, gpus)
        for layout in (Layout.disaggregated(p, gpus - p), Layout.disaggregated(p, gpus - p, conditional=Conditional()))
    ]
    return [Layout.aggregated(gpus), *splits]


def plan(
    profile: EngineProfile,
    gpus: int,
    shapes: Sequence[tuple[int, int]],
    slo: Slo,
    *,
    requests_per_trial: int = DEFAULT_REQUESTS_PER_TRIAL,
    seed: int = 0,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    bisection_steps: int = DEFAULT_BISECTION_STEPS,
) -> Plan:
    """Every candidate for `gpus` engines, ranked by goodput at the highest rate meeting `slo`."""
    if not shapes or requests_per_trial < 1:
        raise ValueError("a plan needs at least one (ISL, OSL) shape and one request per trial")
    search = _RateSearch(profile, shapes, slo, requests_per_trial, seed, max_num_seqs, bisection_steps)
    candidates = [search.candidate(layout, k) for layout in layouts(gpus) for k in sorted(profile.decode)]
    order = {id(candidate): i for i, candidate in enumerate(candidates)}
    # A layout with conditional disaggregation ranks below one without at the same goodput and
    # rate whatever their latency: the rule must add goodput to be worth running (both are held
    # to one colocated bound, where a finite trial's latency alone would otherwise pick it).
    ranked = sorted(
        candidates,
        key=lambda c: (-c.goodput_rps, -c.rate_rps, c.layout.conditional is not None, *_latency(c), order[id(c)]),
    )
    return Plan(ranked=ranked, trials=search.trials)


def evaluate(
    profile: EngineProfile,
    layout: Layout,
    k: int,
    shapes: Sequence[tuple[int, int]],
    slo: Slo,
    requests_per_trial: int = DEFAULT_REQUESTS_PER_TRIAL,
    seed: int = 0,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> Candidate:
    """One layout and K as the search rates it (the highest rate meeting the SLO and the
    goodput there), for a layout the search does not try: engines sharing devices, when a
    measured stack's ranking is checked against the model's (loadtest.plan_check). Its
    throughput bound takes no account of sharing, so the first trial overshoots and the
    bisection below it finds the rate."""
    search = _RateSearch(profile, shapes, slo, requests_per_trial, seed, max_num_seqs, DEFAULT_BISECTION_STEPS)
    return search.candidate(layout, k)


def _latency(candidate: Candidate) -> tuple[float, float]:
    summary = candidate.summary
    return (summary.tpot_ms.p90, summary.ttft_ms.p90) if summary else (0.0, 0.0)


def throughput_bound(
    profile: EngineProfile, layout: Layout, k: int, shapes: Sequence[tuple[int, int]], max_num_seqs: int
) -> float:
    """Requests per second the layout's engines can do at most on the mean shape: full
    prefill steps on the prefill side, the largest batch max_num_seqs and the KV allow on
    the decode side. A colocated engine spends its time on both: its full decode batches,
    plus each prompt's tokens at the prefill curve's cost above a step's fixed cost. With
    conditional disaggregation either side's engines can take the other's work: the bound is
    that of as many colocated engines (never below the split's: the split's is at most
    (P + D) over a prefill's and a decode's time together, which a colocated engine's exceeds
    by the fixed cost it saves). Like the aggregated layout's it is loose (the finite trial at
    90% of it can pass a rate the layout does not sustain: the module docstring's limits)."""
    isl = sum(shape[0] for shape in shapes) / len(shapes)
    osl = sum(shape[1] for shape in shapes) / len(shapes)
    prefill = profile.prefill
    budget = prefill.max_num_batched_tokens
    batch = max(1, min(max_num_seqs, int(profile.kv_tokens // (isl + osl))))
    decode = profile.decode[k]
    decode_s = osl / (batch * decode.tokens_per_step) * decode.step_ms.at(batch) / 1000  # engine time a request
    colocated_s = isl / budget * (prefill.step_ms.at(budget) - prefill.step_ms.intercept()) / 1000 + decode_s
    if layout.is_aggregated:
        return layout.colocated / colocated_s
    prefill_s = isl / budget * prefill.step_ms.at(budget) / 1000
    if layout.conditional is not None:
        return layout.engines / colocated_s
    return min(layout.prefill / prefill_s, layout.decode / decode_s)


def over_slo(summary: Summary, slo: Slo) -> str:
    """The thresholds `summary` breaks, with its values: 'TTFT p90 1,900 ms over the 1,500 ms SLO'."""
    broken = []
    if summary.ttft_ms.p90 > slo.ttft_p90_ms:
        broken.append(f"TTFT p90 {milliseconds(summary.ttft_ms.p90)} over the {milliseconds(slo.ttft_p90_ms)} SLO")
    if summary.tpot_ms.p90 > slo.tpot_p90_ms:
        broken.append(f"TPOT p90 {milliseconds(summary.tpot_ms.p90)} over the {milliseconds(slo.tpot_p90_ms)} SLO")
    return " and ".join(broken)


def milliseconds(value: float) -> str:
    """'1,900 ms', '20.04 ms': whole above 100, else 4 significant digits (20.04 is over 20)."""
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.4g} ms"


class _RateSearch:
    def __init__(
        self,
        profile: EngineProfile,
        shapes: Sequence[tuple[int, int]],
        slo: Slo,
        requests_per_trial: int,
        seed: int,
        max_num_seqs: int,
        bisection_steps: int,
    ) -> None:
        self.profile, self.shapes, self.slo = profile, shapes, slo
        self.requests_per_trial, self.seed = requests_per_trial, seed
        self.max_num_seqs, self.bisection_steps = max_num_seqs, bisection_steps
        self.trials = 0

    def _trial(self, layout: Layout, k: int, rate: float) -> Summary:
        self.trials += 1
        # As many requests before the measured ones as a loaded fleet holds, and as many after.
        margin = min(math.ceil(rate * self._lifetime_s(k)), MAX_MARGIN_TRIALS * self.requests_per_trial)
        requests = workload.poisson(rate, margin + self.requests_per_trial + margin, self.shapes, self.seed)
        run = simulate(self.profile, layout, k, requests, self.max_num_seqs)
        return run.summary(self.slo, slice(margin, margin + self.requests_per_trial))

    def _lifetime_s(self, k: int) -> float:
        """A mean request's time in a loaded fleet: its prefill steps, its hand-off and its
        decode steps at the largest batch; at `rate`, rate times this many are in flight."""
        isl = sum(shape[0] for shape in self.shapes) / len(self.shapes)
        osl = sum(shape[1] for shape in self.shapes) / len(self.shapes)
        prefill, decode = self.profile.prefill, self.profile.decode[k]
        prefill_ms = math.ceil(isl / prefill.max_num_batched_tokens) * prefill.step_ms.at(
            prefill.max_num_batched_tokens
        )
        batch = max(1, min(self.max_num_seqs, int(self.profile.kv_tokens // (isl + osl))))
        decode_ms = math.ceil(osl / decode.tokens_per_step) * decode.step_ms.at(batch)
        return (prefill_ms + self.profile.transfer_ms.at(isl) + decode_ms) / 1000

    def candidate(self, layout: Layout, k: int) -> Candidate:
        bound = throughput_bound(self.profile, layout, k, self.shapes, self.max_num_seqs)
        # At the bound a queue grows without end: a finite trial there can pass and still be
        # a rate no fleet sustains (one of 7P:1D's at its bound met the SLO; 20,000 requests
        # at it broke the TTFT p90 after about 10,000). The rate found is at most this share.
        cap = MAX_UTILIZATION * bound
        at_cap = self._trial(layout, k, cap)
        if at_cap.meets(self.slo):
            limit = f"held to {MAX_UTILIZATION:.0%} of its throughput bound {bound:.3g} req/s (both SLOs met there)"
            return Candidate(layout, k, cap, at_cap, limit)
        low, passed = 0.0, None
        high, failed = cap, at_cap
        for _ in range(self.bisection_steps):
            middle = (low + high) / 2
            summary = self._trial(layout, k, middle)
            if summary.meets(self.slo):
                low, passed = middle, summary
            else:
                high, failed = middle, summary
        if passed is None:
            return Candidate(layout, k, 0.0, None, f"{over_slo(failed, self.slo)} even at {high:.3g} req/s")
        return Candidate(layout, k, low, passed, f"{over_slo(failed, self.slo)} from {high:.3g} req/s")
