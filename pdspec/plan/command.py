"""`pdspec plan`: read the engine profile and the workload, search every layout and K
(`pdspec.plan.search`), print the plan (`pdspec.plan.report`), and write what `--emit` and
`--plot` ask for.

Failure policy: what can be checked before the search is checked first (the profile and
the workload load, matplotlib imports when a plot is asked for, the k8s base has a
kustomization), so a bad input costs no simulation: one line on stderr naming it, exit 2.
After the search: when no layout meets the SLO the plan is printed and nothing is emitted
(exit 1); an emit the layout cannot express (compose or k8s for an aggregated plan) prints
the plan, then one line saying why, exit 2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pdspec.plan import emit, plot, profile, report, routing, search, workload
from pdspec.plan.fleet_model import Slo
from pdspec.plan.profile import EngineProfile, ProfileError
from pdspec.settings import PlanCommand


def load_profile(spec: str) -> EngineProfile:
    """A shipped profile by name, else the profile file at `spec`."""
    shipped = profile.shipped()
    if spec in shipped:
        return profile.load(shipped[spec])
    if not Path(spec).is_file():
        names = ", ".join(shipped) or "none ship yet"
        raise ProfileError(f"{spec}: neither a shipped profile ({names}) nor a file")
    return profile.load(Path(spec))


def run_plan(cmd: PlanCommand) -> int:
    try:
        engine = load_profile(cmd.profile)
        if cmd.acceptance_rate is not None:
            engine = engine.with_acceptance(cmd.acceptance_rate)
        if cmd.workload:
            shapes = workload.shapes_of(workload.load(cmd.workload))
            described = f"{len(shapes)} requests' shapes from {cmd.workload}"
        else:
            shapes, described = [(cmd.isl, cmd.osl)], f"ISL {cmd.isl} / OSL {cmd.osl}"
        if cmd.plot:
            plot.require()
        if cmd.emit == "k8s":
            emit.check_k8s_base(cmd.k8s_base or emit.default_k8s_base(emit.on_gpus(engine)))
    except (ProfileError, workload.WorkloadError, plot.PlotUnavailable, emit.EmitError) as exc:
        return _fail(str(exc))

    for anomaly in engine.anomalies():
        print(
            f"warning: {cmd.profile}: {anomaly}: a noisy curve; a K chosen for it may be its artifact", file=sys.stderr
        )
    slo = Slo(ttft_p90_ms=cmd.slo_ttft_p90_ms, tpot_p90_ms=cmd.slo_tpot_p90_ms)
    started = time.perf_counter()
    plan = search.plan(
        engine,
        cmd.gpus,
        shapes,
        slo,
        requests_per_trial=cmd.requests_per_trial,
        seed=cmd.seed,
        max_num_seqs=cmd.max_num_seqs,
    )
    elapsed = time.perf_counter() - started
    context = (
        f"pdspec plan: {cmd.gpus} GPUs of {engine.gpu}, {engine.model_shape} with {engine.drafter} "
        f"(vLLM {engine.vllm_version}), workload {described}"
        + (f", draft acceptance rate {cmd.acceptance_rate:g} (given)" if cmd.acceptance_rate is not None else "")
    )
    advice = routing.advise(plan.best.layout, slo) if plan.best.summary is not None else None
    print(report.render(plan, slo, context, advice), end="")
    print(
        f"\nSearched {len(plan.ranked)} layouts x K in {plan.trials} simulated trials of "
        f"{cmd.requests_per_trial} measured requests each, {elapsed:.1f} s. Predictions of the fleet model "
        "(pdspec/plan/fleet_model.py: no prefix caching), not measurements."
    )
    if cmd.plot:
        slo_text = f"SLO TTFT p90 <= {cmd.slo_ttft_p90_ms:g} ms, TPOT p90 <= {cmd.slo_tpot_p90_ms:g} ms"
        print(f"plot: {plot.draw(plan, cmd.plot, f'{context}; {slo_text}')}")
    if plan.best.summary is None:
        if cmd.emit != "none":
            print("pdspec plan: nothing to emit: no layout meets the SLO", file=sys.stderr)
        return 1
    if cmd.emit == "none":
        return 0
    best = plan.best
    title = (
        f"pdspec plan: {best.layout}, K={best.k} for {cmd.gpus} GPUs of {engine.gpu}, {described}, "
        f"SLO TTFT p90 {cmd.slo_ttft_p90_ms:g} ms / TPOT p90 {cmd.slo_tpot_p90_ms:g} ms "
        f"(predicted goodput {best.goodput_rps:.3g} req/s)"
    )
    longest = max(isl + osl for isl, osl in shapes)
    settings = advice.settings if advice is not None else {}
    deployment = emit.Deployment.of(best.layout, best.k, engine, cmd.max_num_seqs, title, longest, settings)
    try:
        written = emit.write(cmd.emit, deployment, cmd.out, cmd.k8s_base)
    except emit.EmitError as exc:
        return _fail(str(exc))
    print(f"{cmd.emit}: {written}")
    return 0


def _fail(message: str) -> int:
    print(f"pdspec plan: {message}", file=sys.stderr)
    return 2
