"""The RAG projection's rates held for longer: the planner's search rates a layout by finite
trials (200 measured requests after a margin), which can pass a rate whose queue grows too
slowly to show in them. Here the fleet model runs each layout the search named for RAG (ISL
8,000, OSL 200) and the aggregated layout beside it, 4,000 requests on 8 GPUs and 12,000 on
64, at the search's rate and below it, and reports TTFT p90, TPOT p90 and the share of
requests meeting the SLO over the second and third quarters of the requests (a growing queue
shows as the third quarter's TTFT above the second's).

    python loadtest/results/plan/projection-h200-qwen3-8b/long_runs.py   # writes long_runs.md here

A projection's cross-check, run by the same model: no measurement.
"""

from pathlib import Path

from pdspec.plan import profile, workload
from pdspec.plan.fleet_model import Conditional, Layout, Slo, simulate

HERE = Path(__file__).resolve().parent
SLO = Slo(ttft_p90_ms=2000, tpot_p90_ms=50)
SHAPE = (8000, 200)
RUNS = [  # (layout, rate, requests): the search's rate first, then below it
    (Layout.disaggregated(4, 4, conditional=Conditional()), 38.2, 4000),
    (Layout.disaggregated(4, 4, conditional=Conditional()), 35.0, 4000),
    (Layout.aggregated(8), 27.67, 4000),
    (Layout.aggregated(8), 25.0, 4000),
    (Layout.disaggregated(48, 16, conditional=Conditional()), 310.71, 12000),
    (Layout.disaggregated(48, 16, conditional=Conditional()), 280.0, 12000),
    (Layout.disaggregated(48, 16, conditional=Conditional()), 250.0, 12000),
    (Layout.aggregated(64), 283.09, 12000),
    (Layout.aggregated(64), 250.0, 12000),
]


def main() -> None:
    engine = profile.load(profile.shipped()["h200-qwen3-8b-eagle3"]).with_acceptance(0.67)
    lines = [
        "| layout | rate req/s | requests | TTFT p90 ms, 2nd / 3rd quarter | TPOT p90 ms | meeting the SLO | sustained |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for layout, rate, count in RUNS:
        run = simulate(engine, layout, 1, workload.poisson(rate, count, [SHAPE], seed=0))
        second = run.summary(SLO, slice(count // 4, count // 2))
        third = run.summary(SLO, slice(count // 2, 3 * count // 4))
        held = third.meets(SLO) and second.meets(SLO)
        lines.append(
            f"| {layout}, K=1 | {rate:g} | {count:,} | {second.ttft_ms.p90:,.0f} / {third.ttft_ms.p90:,.0f} "
            f"| {third.tpot_ms.p90:.1f} | {third.attainment:.2f} | {'yes' if held else 'no'} |"
        )
        print(lines[-1], flush=True)
    (HERE / "long_runs.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
