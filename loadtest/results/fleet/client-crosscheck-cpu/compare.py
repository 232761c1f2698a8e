"""Per-rate TTFT/TPOT p50/p90 and achieved rate from both clients' raw results, computed the
same way for both (np.percentile, linear; TPOT = (e2e - ttft) / (output - 1), vLLM's definition
and serve_stats.RequestResult.tpot_s alike; achieved rate = completed / (last completion - first send)).

    python loadtest/results/fleet/client-crosscheck-cpu/compare.py DIR   (DIR: this folder)
"""

import json
import sys
from pathlib import Path

import numpy as np


def summary(ttft, tpot, start, end, chunks):
    p = lambda xs, q: float(np.percentile(np.asarray(xs) * 1000, q))  # noqa: E731
    return {
        "n": len(ttft),
        "ttft_p50": p(ttft, 50),
        "ttft_p90": p(ttft, 90),
        "tpot_p50": p(tpot, 50),
        "tpot_p90": p(tpot, 90),
        "offered_rps": (len(start) - 1) / (max(start) - min(start)),
        "achieved_rps": len(ttft) / (max(end) - min(start)),
        "chunks_per_reply": float(np.mean(chunks)) if chunks else None,
    }


def cell(ss: list[dict], k: str, f: str) -> str:
    """mean [min-max] of one figure over runs."""
    values = [x[k] for x in ss]
    return f"{np.mean(values):{f}} [{min(values):{f}}-{max(values):{f}}]"


def pdspec(path: Path) -> dict[float, dict]:
    bench = json.loads((path / "fleet_bench.json").read_text())
    if not bench["jobs"]:
        return {}
    job = bench["jobs"][0]
    rows = [json.loads(line) for line in next(path.glob("requests-*.jsonl")).open()]
    out = {}
    for level in job["levels"]:
        rs = [r for r in rows if r["phase"] == level["phase"] and r["ok"]]
        assert len(rs) == level["requests"], (path, level["phase"])
        out[level["qps"]] = summary(
            [r["ttft_s"] for r in rs],
            [r["tpot_s"] for r in rs],
            [r["sent_s"] for r in rs],
            [r["done_s"] for r in rs],
            [],
        )
    return out


def vllm(path: Path) -> tuple[float, dict]:
    j = json.loads(path.read_text())
    ok = [i for i, e in enumerate(j["errors"]) if not e]
    ttft = [j["ttfts"][i] for i in ok]
    tpot = [(j["latencies"][i] - j["ttfts"][i]) / (j["output_lens"][i] - 1) for i in ok]
    start = [j["start_times"][i] for i in ok]
    end = [j["start_times"][i] + j["latencies"][i] for i in ok]
    s = summary(ttft, tpot, start, end, [len(j["itls"][i]) + 1 for i in ok])
    s["vllm_reported"] = {
        k: j[k] for k in ("p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms", "p90_tpot_ms", "request_throughput")
    }
    return j["request_rate"], s


def main(root: Path) -> None:
    rows = []
    for d in sorted(root.glob("pdspec-sc*")):
        if (d / "fleet_bench.json").exists():
            for qps, s in pdspec(d).items():
                rows.append(("pdspec fleet_bench", d.name, qps, s))
    for f in sorted(root.glob("vllm-r*-rate*.json")):
        qps, s = vllm(f)
        rows.append(("vllm bench serve", f.stem, qps, s))
    rows.sort(key=lambda r: (r[2], r[0], r[1]))
    print("| rate | client | run | n | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 | offered req/s | achieved req/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for client, run, qps, s in rows:
        print(
            f"| {qps:g} | {client} | {run} | {s['n']} | {s['ttft_p50']:.1f} | {s['ttft_p90']:.1f} | "
            f"{s['tpot_p50']:.2f} | {s['tpot_p90']:.2f} | {s['offered_rps']:.2f} | {s['achieved_rps']:.2f} |"
        )
    print()
    print("Per client and rate: mean of the runs' figures [min-max]")
    print()
    print("| rate | client | runs | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 | achieved req/s |")
    print("|---|---|---|---|---|---|---|---|")
    for qps in sorted({r[2] for r in rows}):
        for client in sorted({r[0] for r in rows}):
            ss = [r[3] for r in rows if r[0] == client and r[2] == qps]
            print(
                f"| {qps:g} | {client} | {len(ss)} | {cell(ss, 'ttft_p50', '.1f')} | {cell(ss, 'ttft_p90', '.1f')} | "
                f"{cell(ss, 'tpot_p50', '.2f')} | {cell(ss, 'tpot_p90', '.2f')} | {cell(ss, 'achieved_rps', '.2f')} |"
            )
    json.dump(
        [{"client": c, "run": r, "qps": q, **s} for c, r, q, s in rows], open(root / "summary.json", "w"), indent=1
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
