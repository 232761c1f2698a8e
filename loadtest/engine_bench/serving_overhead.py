"""A profile's serving term, from a hand-off probe: what a request spends outside the engines.

An engine profile's curves are engine steps; a request through the stack also crosses the
proxy, two HTTP servers (one for a colocated worker), the prefill response and the
hand-off's notifications. `loadtest.handoff_probe --out FILE` times one request at a time
on an idle 1P1D stack, stage by stage; this tool turns its medians into the profile's
`serving_ms` (`pdspec.plan.profile.ServingOverhead`):

- **disaggregated**: the probe's TTFT through the proxy, less the fleet model's TTFT for the
  same request (the probe's prompt length and output, the stack's K) on an idle 1P:1D fleet
  from the curves alone;
- **aggregated**: the decode worker's TTFT when it prefills the prompt itself (asked
  directly), plus the proxy's own share of the disaggregated path (its TTFT less both legs),
  less the model's TTFT for the request on one idle colocated engine.

Each is a difference of a measurement and the model at the same point, so the model matches
the probe at idle by construction; what it is worth shows under load, against `serve_bench`
phases (`loadtest.plan_check`). A negative difference (the curves alone already exceed the
probe) is kept as 0, and said.

`python -m loadtest.engine_bench.serving_overhead --profile P --probe probe.json --k 3 --out P`
rewrites the profile with the term (its other fields as they were) and prints the figures.
Failure policy: a probe file without the fields it needs, or a K the profile lacks, exits
with the reason before anything is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pdspec.plan import profile as profiles
from pdspec.plan.fleet_model import Layout, simulate
from pdspec.plan.profile import EngineProfile, ServingOverhead
from pdspec.plan.workload import Request

PROBE_MEDIANS = ("proxy_ttft_ms", "prefill_leg_ms", "decode_pull_ttft_ms", "decode_local_ttft_ms")


def idle_ttft_ms(profile: EngineProfile, layout: Layout, k: int, isl: int, osl: int) -> float:
    """The fleet model's TTFT for one request on an idle fleet, from the curves alone."""
    bare = profile.model_copy(update={"serving_ms": None})
    return simulate(bare, layout, k, [Request(0.0, isl, osl)]).outcomes[0].ttft_s * 1000


def serving_overhead(profile: EngineProfile, probe: dict, k: int, source: str) -> tuple[ServingOverhead, dict]:
    """The term, and the figures it came from (for the record). ValueError for a probe
    without its medians or prompt shape, or a K the profile has no decode curve for."""
    median = probe.get("median", {})
    missing = [key for key in PROBE_MEDIANS if key not in median] + [
        key for key in ("input_len", "max_tokens") if key not in probe
    ]
    if missing:
        raise ValueError(f"the probe has no {', '.join(missing)} (a handoff_probe --out file of this version)")
    if k not in profile.decode:
        raise ValueError(f"the profile has no decode curve for K={k} (it has K={sorted(profile.decode)})")
    isl, osl = probe["input_len"], probe["max_tokens"]
    model_pd = idle_ttft_ms(profile, Layout.disaggregated(1, 1), k, isl, osl)
    model_agg = idle_ttft_ms(profile, Layout.aggregated(1), k, isl, osl)
    proxy_own = max(0.0, median["proxy_ttft_ms"] - median["prefill_leg_ms"] - median["decode_pull_ttft_ms"])
    figures = {
        "input_len": isl,
        "max_tokens": osl,
        "k": k,
        "probe_ttft_ms": median["proxy_ttft_ms"],
        "model_disaggregated_ttft_ms": round(model_pd, 1),
        "probe_local_ttft_ms": median["decode_local_ttft_ms"],
        "proxy_own_ms": round(proxy_own, 1),
        "model_aggregated_ttft_ms": round(model_agg, 1),
        "disaggregated_ms": round(median["proxy_ttft_ms"] - model_pd, 1),
        "aggregated_ms": round(median["decode_local_ttft_ms"] + proxy_own - model_agg, 1),
    }
    term = ServingOverhead(
        disaggregated_ms=max(0.0, figures["disaggregated_ms"]),
        aggregated_ms=max(0.0, figures["aggregated_ms"]),
        source=source,
    )
    return term, figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="a profile file, or a shipped profile's name")
    parser.add_argument("--probe", type=Path, required=True, help="a `loadtest.handoff_probe --out` file")
    parser.add_argument("--k", type=int, required=True, help="the draft length the probed stack ran")
    parser.add_argument("--source", required=True, help="where and when the probe ran, for the profile's record")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    path = profiles.shipped().get(args.profile, Path(args.profile))
    profile = profiles.load(path)
    try:
        term, figures = serving_overhead(profile, json.loads(args.probe.read_text()), args.k, args.source)
    except (OSError, ValueError) as exc:
        sys.exit(f"serving_overhead: {exc}")
    for kind in ("disaggregated", "aggregated"):
        if figures[f"{kind}_ms"] < 0:
            print(
                f"{kind}: the curves alone exceed the probe by {-figures[f'{kind}_ms']} ms; kept as 0", file=sys.stderr
            )
    args.out.write_text(profile.model_copy(update={"serving_ms": term}).dump())
    print(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
