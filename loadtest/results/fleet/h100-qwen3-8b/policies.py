"""Routing policies on the H100 (calls 9-12): always-disaggregated 2P2D under round_robin,
least_outstanding, prefix_affinity and kv_aware, the sc3x figures per QPS as mean [min-max]
over the calls that ran each, beside colocated kv_aware (every H100 call that ran it) and 2P2D
conditional disaggregation with the pending count (calls 1, 2, 4), and one plot.

    python loadtest/results/fleet/h100-qwen3-8b/policies.py

Reads each `call-*/fleet_report.json` (written by `python -m loadtest.fleet_report`) through
`layouts.py`'s helpers and writes `policies.md` and `policies.png` here. The prefill pool's hit
rate is set beside the achievable reference fleet_report replays offline (LRU per worker of the
same size, an oracle router, EAGLE's dropped last block): on two prefill workers of 1,791 blocks
no router can hit more than that, whatever it knows.
"""

import json
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from layouts import HERE, SLO, levels, runs, spread  # noqa: E402

ROUTING_CALLS = range(9, 13)
ROUTING = ("round_robin", "least_outstanding", "prefix_affinity", "kv_aware")
# The references, from the calls that ran them: the layout that wins on this card, and the
# default rule on the same fleet.
REFERENCES = (("any", "colocated_kv_aware", range(1, 13)), ("2P2D", "kv_aware_conditional_pending", range(1, 9)))


def achievable(call: int) -> float:
    """The achievable prefill-pool hit rate of `call`'s trace: the oracle on this many prefill
    workers, with EAGLE's dropped last block (what a drafter-carrying worker can keep)."""
    report = json.loads((HERE / f"call-{call}" / "fleet_report.json").read_text())
    return report["reference"]["sc3x"]["by_workers"][str(report["prefill_workers"])]["eagle"]["achievable"]


def selected() -> list[tuple[str, list[dict]]]:
    """(label, runs) for the routing policies, then the references, each in call order."""
    routing = runs(ROUTING_CALLS)
    rows = [(policy, routing[("2P2D", policy)]) for policy in ROUTING]
    for layout, policy, calls in REFERENCES:
        rows.append((f"{policy} ({layout})" if layout != "any" else policy, runs(calls)[(layout, policy)]))
    return rows


def main() -> None:
    rows = selected()
    reference = statistics.mean(achievable(call) for call in ROUTING_CALLS)
    lines = [
        f"Prefill-pool hit rate achievable on this fleet (2P2D, oracle router, LRU of 1,791 blocks a worker, "
        f"EAGLE's dropped last block): {reference:.3f}.",
        "",
        "| policy | runs (calls) | goodput relaxed | goodput strict | fleet hit (whole trace) | recomputed share |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label, summaries in rows:
        calls = ", ".join(s["call"].removeprefix("call-") for s in summaries)
        lines.append(
            f"| {label} | {len(summaries)} ({calls}) "
            f"| {spread([s['goodput'][SLO]['rps'] or 0.0 for s in summaries], 2)} "
            f"| {spread([s['goodput']['strict']['rps'] or 0.0 for s in summaries], 2)} "
            f"| {spread([s['fleet_hit_rate'] for s in summaries], 2)} "
            f"| {spread([s['recomputed_tokens'] / s['prompt_tokens'] for s in summaries], 2)} |"
        )
    lines += [
        "",
        "| policy | QPS | TTFT p50 ms | TTFT p90 ms | TPOT p90 ms | relaxed SLO-met rps | prefill-pool hit | route p90 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, summaries in rows:
        for i, first in enumerate(levels(summaries[0])):
            lv = [levels(s)[i] for s in summaries]
            lines.append(
                f"| {label} | {first['qps']:g} | {spread([x['ttft_ms']['p50'] for x in lv])} "
                f"| {spread([x['ttft_ms']['p90'] for x in lv])} | {spread([x['tpot_ms']['p90'] for x in lv], 1)} "
                f"| {spread([x['slo'][SLO]['slo_rps'] for x in lv], 2)} "
                f"| {spread([x['prefill_pool_hit_rate'] for x in lv], 2)} "
                f"| {spread([x['route_ms']['p90'] for x in lv], 1)} |"
            )
    (HERE / "policies.md").write_text("\n".join(lines) + "\n")

    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    for label, summaries in rows:
        qps = [lv["qps"] for lv in levels(summaries[0])]
        style = "-" if label in ROUTING else "--"
        for axis, pick in (
            (axes[0], lambda lv: lv["slo"][SLO]["slo_rps"]),
            (axes[1], lambda lv: lv["ttft_ms"]["p90"] / 1000),
            (axes[2], lambda lv: lv["prefill_pool_hit_rate"]),
        ):
            per_level = [[pick(levels(s)[i]) for s in summaries] for i in range(len(qps))]
            axis.plot(
                qps,
                [statistics.mean(v) for v in per_level],
                style,
                marker="o",
                label=f"{label} ({len(summaries)} runs)",
            )
            axis.fill_between(qps, [min(v) for v in per_level], [max(v) for v in per_level], alpha=0.15)
    axes[0].set(xlabel="offered QPS (sc3x)", ylabel="requests/s meeting TTFT p90 <= 2 s, TPOT p90 <= 100 ms")
    axes[0].set_title("SLO-met rate (mean, band = min-max)")
    axes[1].set(xlabel="offered QPS (sc3x)", ylabel="TTFT p90 (s)", yscale="log")
    axes[1].axhline(2.0, color="grey", lw=0.8)
    axes[1].set_title("TTFT p90 (2 s SLO line)")
    axes[2].set(xlabel="offered QPS (sc3x)", ylabel="hit rate of the prompts' tokens")
    axes[2].axhline(reference, color="black", lw=1, ls=":", label=f"achievable on 2 prefill workers ({reference:.2f})")
    axes[2].set_title("Prefill-pool hit rate (colocated: the whole fleet's)")
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    fig.suptitle("Routing policies, 2P2D of the Qwen3-8B shape on one H100, sc3x (working set 3.4x the fleet's KV)")
    fig.tight_layout()
    fig.savefig(HERE / "policies.png", dpi=110)


if __name__ == "__main__":
    main()
