"""pdspec's `loadtest.serve_bench` against vLLM's `vllm bench serve`, on one running stack.

    python -m loadtest.micro.bench_tools --url http://127.0.0.1:8000 \\
        --input-len 256 --output-len 32 --num-prompts 24 --concurrency 2 --rounds 3 \\
        --out loadtest/results/bench_tools/cpu

Three runs per round, in an order that rotates from round to round so drift hits all
alike: vLLM's tool on its random dataset, serve_bench on its own default prompts (token
ids drawn uniformly, `--dataset uniform`), and serve_bench on vLLM's prompts
(`--dataset vllm-random`: the same texts for the same seed). Each gets `--num-prompts`
prompts of `--input-len` tokens, `--output-len` tokens each (`ignore_eos`; vLLM sets it
for its random dataset), at most `--concurrency` in flight, all sent at once. Figures come
from the tools' own result files (serve_bench.json, client side only; vLLM's
`--save-result` JSON); with `--decode-url`, the decode worker's mean acceptance length
over each run too (its spec-decode counters before and after). Writes bench_tools.json,
bench_tools.md and bench_tools.png (each figure's ratio to vLLM's, per round) to `--out`.

vLLM's tool gets `--temperature 0`, as serve_bench's requests are greedy: by default it
sends no temperature, so the server samples at 1.0 (`--vllm-default-temperature` keeps
that). Both tools time the same things: TTFT, ITL per streamed chunk, TPOT as (latency - TTFT) /
(tokens - 1), throughput as tokens over the window from the first request sent to the
last reply done. With speculative decoding the sampling and the prompts' content decide
how many drafts are accepted, so how many tokens each decode step gives: vLLM's random
dataset is runs of consecutive token ids, serve_bench's default is ids drawn uniformly.

The fleet's shape (many tenants, a long shared context, short queries, an arrival rate):

    python -m loadtest.micro.bench_tools --url http://127.0.0.1:8001 --dataset prefix-repetition \
        --prefix-len 4096 --suffix-len 256 --num-prefixes 96 --output-len 48 --num-prompts 192 \
        --request-rate 4 --rounds 2 --prefill-url http://127.0.0.1:8100 --prefill-url http://127.0.0.1:8101 \
        --decode-url http://127.0.0.1:8200 --decode-url http://127.0.0.1:8201 --model M --out DIR

`--dataset prefix-repetition`: vLLM's `prefix_repetition` dataset (`--num-prefixes`
prefixes of `--prefix-len` tokens, each followed by `--num-prompts / --num-prefixes`
suffixes of `--suffix-len`, shuffled) and serve_bench on the same texts in the same order
(`--dataset vllm-prefix-repetition`); serve_bench's own uniform prompts have no such shape,
so two runs a round, not three. `--request-rate R`: Poisson arrivals at R a second in both
tools (`--concurrency` then caps the requests in flight; unset, no cap). serve_bench on
vLLM's prompts then runs with `--arrivals vllm`: it sends at the instants vLLM's tool
sends at for the same seed, dataset and rate (the same gamma draws from numpy's state
after the same sampling, rescaled as vLLM rescales them), each counted from its own run's
start; so those two runs share the prompts, their order and their send schedule (the
report says so, from serve_bench's own result file). serve_bench on its own uniform prompts
(random dataset) keeps its own Poisson draw. Both tools report TTFT and TPOT p90 too (vLLM
with `--metric-percentiles 50,90,99`). With `--prefill-url`s, the prefill pool's
prefix-cache hit rate over each run (`vllm:prefix_cache_hits_total` over `queries_total`,
before and after, summed over the pool): on the same prompts at the same instants it must
agree closely, as routing and eviction follow the order and the timing (whether a tenant's
next prompt comes while its prefix is still being prefilled, or after it was evicted). For that every run starts cold: before each, every worker
given (`--prefill-url`, `--decode-url`) has its prefix cache reset (POST
/reset_prefix_cache, served with VLLM_SERVER_DEV_MODE=1 on the workers) and, when the
proxy keeps a KV index that has taken events, the run waits until the index applied the
resets. On by default for prefix-repetition (`--no-reset-caches` turns it off), off for
random (`--reset-caches` turns it on). Failure policy: a worker that refuses the reset (no
dev mode: 404) is recorded in the run's `reset` and named in the report, and the runs go
on from warm caches; a tool that fails stops the comparison (SystemExit with its output).
The JSON and the table are rewritten after every round, so a cut run keeps its rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from loadtest.serving import fleet_bench, worker_metrics

# (figure, how serve_bench's phase gives it, vLLM's result key)
FIGURES = (
    ("completed", lambda p: p["completed"], "completed"),
    ("input_tokens", lambda p: p["prompt_tokens"], "total_input_tokens"),
    ("output_tokens", lambda p: p["output_tokens"], "total_output_tokens"),
    ("duration_s", lambda p: p["duration_s"], "duration"),
    ("output_tokens_per_s", lambda p: p["output_tokens_per_s"], "output_throughput"),
    ("ttft_ms_median", lambda p: p["ttft_ms"]["median"], "median_ttft_ms"),
    ("ttft_ms_p90", lambda p: p["ttft_ms"]["p90"], "p90_ttft_ms"),
    ("itl_ms_median", lambda p: p["itl_ms"]["median"], "median_itl_ms"),
    ("tpot_ms_median", lambda p: p["tpot_ms"]["median"], "median_tpot_ms"),
    ("tpot_ms_p90", lambda p: p["tpot_ms"]["p90"], "p90_tpot_ms"),
)
# Figures from the workers' counters over a run, not from the tools.
WORKER_FIGURES = ("decode_acceptance_length", "prefill_prefix_cache_hit_rate")


TOOLS = ("vllm_bench_serve", "serve_bench", "serve_bench_vllm_prompts")
VLLM = "vllm_bench_serve"
# The runs of a round, by dataset: serve_bench's own (uniform) prompts have no shared prefixes.
DATASET_TOOLS = {"random": TOOLS, "prefix-repetition": (VLLM, "serve_bench_vllm_prompts")}


def load_argv(args, tool: str) -> list[str]:
    """The load, in each tool's flags: all at once under a cap, or Poisson arrivals at a rate
    (capped only when --concurrency is given); at a rate, serve_bench on vLLM's prompts
    sends at vLLM's instants (`--arrivals vllm`)."""
    if tool == VLLM:
        rate = "inf" if args.request_rate is None else str(args.request_rate)
        cap = [] if args.concurrency is None else ["--max-concurrency", str(args.concurrency)]
        return [*cap, "--request-rate", rate]
    cap = [] if args.concurrency is None else ["--concurrency", str(args.concurrency)]
    if args.request_rate is None:
        return cap
    arrivals = ["--arrivals", "vllm"] if tool == "serve_bench_vllm_prompts" else []
    return [*cap, "--request-rate", str(args.request_rate), *arrivals]


def dataset_argv(args, tool: str) -> list[str]:
    """The prompts, in each tool's flags (serve_bench's own: token ids drawn uniformly)."""
    prefix = args.dataset == "prefix-repetition"
    if tool == VLLM and prefix:
        return [
            "--dataset-name",
            "prefix_repetition",
            "--prefix-repetition-prefix-len",
            str(args.prefix_len),
            "--prefix-repetition-suffix-len",
            str(args.suffix_len),
            "--prefix-repetition-num-prefixes",
            str(args.num_prefixes),
            "--prefix-repetition-output-len",
            str(args.output_len),
        ]
    if tool == VLLM:
        return [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(args.input_len),
            "--random-output-len",
            str(args.output_len),
        ]
    if tool == "serve_bench":
        return ["--dataset", "uniform", "--input-len", str(args.input_len)]
    if prefix:
        return [
            "--dataset",
            "vllm-prefix-repetition",
            "--prefix-len",
            str(args.prefix_len),
            "--suffix-len",
            str(args.suffix_len),
            "--num-prefixes",
            str(args.num_prefixes),
        ]
    return ["--dataset", "vllm-random", "--input-len", str(args.input_len)]


def serve_bench_argv(args, out: Path, seed: int, tool: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "loadtest.serve_bench",
        "--url",
        args.url,
        "--model",
        args.model,
        "--no-worker-metrics",
        "--no-progress",
        *dataset_argv(args, tool),
        "--output-len",
        str(args.output_len),
        "--num-prompts",
        str(args.num_prompts),
        *load_argv(args, tool),
        "--tokenizer",
        str(args.tokenizer),
        "--seed",
        str(seed),
        "--out",
        str(out),
    ]


def tool_argv(tool: str, args, out: Path, seed: int) -> list[str]:
    if tool == VLLM:
        return vllm_argv(args, out, seed)
    return serve_bench_argv(args, out, seed, tool)


def pool_counters(urls: list[str] | None) -> list[dict[str, float]] | None:
    """Each worker's counters once it is idle (None: no URL given)."""
    if not urls:
        return None
    with httpx.Client(timeout=10) as client:
        return [worker_metrics.scrape_when_idle(client, url) for url in urls]


def pool_delta(before: list[dict] | None, after: list[dict] | None) -> dict[str, float] | None:
    """The pool's counters over a run, summed over its workers (None: not read)."""
    if before is None or after is None:
        return None
    return worker_metrics.sum_deltas([worker_metrics.deltas(b, a) for b, a in zip(before, after)])


def worker_run_figures(prefill: dict | None, decode: dict | None) -> dict[str, float]:
    """The run's figures from the pools' summed deltas: the decode pool's mean acceptance
    length, the prefill pool's prefix-cache hit rate; a figure left out when its pool was
    not read or saw nothing (no drafts, no lookups)."""
    figures = {}
    if decode is not None and (accepted := worker_metrics.acceptance_length(decode)) is not None:
        figures["decode_acceptance_length"] = accepted
    if prefill is not None and (hit_rate := worker_metrics.prefix_cache_hit_rate(prefill)) is not None:
        figures["prefill_prefix_cache_hit_rate"] = hit_rate
    return figures


def proxy_kv_events(url: str) -> dict[str, float]:
    """The proxy's `pdspec_proxy_kv_events_total` by kind (empty: not a pdspec proxy, or none read)."""
    try:
        return {
            labels[0][1]: value
            for labels, value in fleet_bench.proxy_counter(
                {"url": url, "ready_path": "/ready"}, "pdspec_proxy_kv_events_total"
            ).items()
            if labels
        }
    except (httpx.HTTPError, ValueError):
        return {}


def reset_caches(args) -> dict:
    """Every given worker's prefix cache emptied before a run (fleet_bench.reset_caches:
    retried while blocks are held, a 404 refused at once), and, where the proxy's KV index
    has taken events (kv_aware policies), a wait until it applied one AllBlocksCleared per
    worker, so it routes the run from empty caches too. Returns reset_caches's record with
    `index_cleared` (None: no index to wait for, or a worker refused)."""
    workers = {"prefill": args.prefill_url or [], "decode": args.decode_url or []}
    events = proxy_kv_events(args.url)
    reset = fleet_bench.reset_caches(workers, args.model)
    reset["index_cleared"] = None
    if sum(events.values()) > 0 and not reset["refused"]:
        front = {"url": args.url, "ready_path": "/ready"}
        count = len(workers["prefill"]) + len(workers["decode"])
        reset["index_cleared"] = fleet_bench.wait_index_cleared(front, events.get("cleared", 0.0), count)
    return reset


def decode_counters(decode_url: str | None) -> dict[str, float] | None:
    """The decode worker's counters once it is idle (None: no URL given)."""
    if decode_url is None:
        return None
    with httpx.Client(timeout=10) as client:
        return worker_metrics.scrape_when_idle(client, decode_url)


def vllm_argv(args, out: Path, seed: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "loadtest.micro.vllm_bench_serve",
        "--backend",
        "openai",
        "--base-url",
        args.url,
        "--endpoint",
        "/v1/completions",
        "--model",
        args.model,
        "--tokenizer",
        str(args.tokenizer),
        *dataset_argv(args, VLLM),
        # Every reply its full length, as serve_bench's (vLLM sets it by itself for random only).
        "--ignore-eos",
        "--num-prompts",
        str(args.num_prompts),
        *load_argv(args, VLLM),
        "--seed",
        str(seed),
        "--num-warmups",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl",
        "--metric-percentiles",
        "50,90,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(out),
        "--result-filename",
        "vllm.json",
        # Greedy, as serve_bench is: vLLM's tool no longer sets temperature 0 by itself,
        # and sampled decoding accepts fewer drafts (see the module's docstring).
        *([] if args.vllm_default_temperature else ["--temperature", "0"]),
    ]


def run_tool(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{argv[2]} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def pdspec_figures(out: Path) -> dict[str, float]:
    (phase,) = json.loads((out / "serve_bench.json").read_text())["phases"]
    return {name: pick(phase) for name, pick, _ in FIGURES}


def pdspec_arrivals(out: Path) -> str | None:
    """How serve_bench timed its run, as its result file says: "vllm" (vLLM's instants),
    "own" (its own Poisson draw), None (all at once, or a serve_bench that does not say)."""
    (phase,) = json.loads((out / "serve_bench.json").read_text())["phases"]
    return phase.get("arrivals")


def vllm_figures(out: Path) -> dict[str, float]:
    result = json.loads((out / "vllm.json").read_text())
    return {name: result[key] for name, _, key in FIGURES}


def compare(rounds: list[dict], ours: str = "serve_bench") -> dict[str, dict]:
    """Per figure: each tool's median over rounds, and the ratio `ours` / vLLM's of each
    round and their median (None where vLLM's figure is 0 or missing)."""
    summary = {}
    names = [name for name, _, _ in FIGURES] + list(WORKER_FIGURES)
    for name in names:
        pairs = [(r[ours].get(name), r[VLLM].get(name)) for r in rounds if ours in r]
        if not pairs or all(a is None for a, _ in pairs):
            continue
        ratios = [a / b for a, b in pairs if a is not None and b]
        summary[name] = {
            ours: statistics.median(a for a, _ in pairs if a is not None),
            VLLM: statistics.median(b for _, b in pairs if b is not None),
            "ratio_median": statistics.median(ratios) if ratios else None,
            "ratios": ratios,
        }
    return summary


def run(args, on_round=None) -> dict:
    """Every round's runs; `on_round(report so far)` after each round."""
    tools = DATASET_TOOLS[args.dataset]
    report = {
        "command": "python -m loadtest.micro.bench_tools " + " ".join(args.argv),
        "url": args.url,
        "model": args.model,
        "dataset": args.dataset,
        "input_len": args.input_len,
        "prefix_len": args.prefix_len,
        "suffix_len": args.suffix_len,
        "num_prefixes": args.num_prefixes,
        "output_len": args.output_len,
        "num_prompts": args.num_prompts,
        "concurrency": args.concurrency,
        "request_rate": args.request_rate,
        "prefill_urls": args.prefill_url or [],
        "decode_urls": args.decode_url or [],
        "reset_caches": args.reset_caches,
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as scratch:
        for index in range(args.rounds):
            shift = index % len(tools)
            order = tools[shift:] + tools[:shift]  # each tool first in turn
            figures, resets, arrivals = {}, {}, {}
            for tool in order:
                out = Path(scratch) / f"{index}-{tool}"
                if args.reset_caches:
                    resets[tool] = reset_caches(args)
                prefill_before, decode_before = pool_counters(args.prefill_url), pool_counters(args.decode_url)
                run_tool(tool_argv(tool, args, out, args.seed + index))
                prefill_after, decode_after = pool_counters(args.prefill_url), pool_counters(args.decode_url)
                figures[tool] = vllm_figures(out) if tool == VLLM else pdspec_figures(out)
                if tool != VLLM:
                    arrivals[tool] = pdspec_arrivals(out)
                figures[tool].update(
                    worker_run_figures(
                        pool_delta(prefill_before, prefill_after), pool_delta(decode_before, decode_after)
                    )
                )
                hit_rate = figures[tool].get("prefill_prefix_cache_hit_rate")
                print(
                    f"round {index + 1}/{args.rounds} {tool}: {figures[tool]['output_tokens_per_s']:.1f} out tok/s"
                    + ("" if hit_rate is None else f", prefill prefix-cache hit rate {hit_rate:.3f}"),
                    file=sys.stderr,
                    flush=True,
                )
            report["rounds"].append(
                {"round": index, "order": list(order), **figures, "resets": resets, "arrivals": arrivals}
            )
            summarize(report)
            if on_round is not None:
                on_round(report)
    return report


def summarize(report: dict) -> None:
    """The report's comparisons over its rounds so far, and the resets that were refused."""
    for key, ours in (("summary", "serve_bench"), ("summary_vllm_prompts", "serve_bench_vllm_prompts")):
        if ours in DATASET_TOOLS[report["dataset"]]:
            report[key] = compare(report["rounds"], ours)
    report["resets_refused"] = sorted(
        {refusal for r in report["rounds"] for reset in r.get("resets", {}).values() for refusal in reset["refused"]}
    )


def shape_line(report: dict) -> str:
    if report.get("dataset") == "prefix-repetition":
        prompts = (
            f"{report['num_prompts']} prompts over {report['num_prefixes']} shared prefixes of {report['prefix_len']} "
            f"tokens ({report['num_prompts'] // report['num_prefixes']} each, vLLM's order) + {report['suffix_len']}-token suffixes"
        )
    else:
        prompts = f"{report['num_prompts']} prompts of {report['input_len']} tokens"
    if report.get("request_rate") is None:
        load = f"concurrency {report['concurrency']}"
    else:
        cap = "" if report.get("concurrency") is None else f", at most {report['concurrency']} in flight"
        load = f"Poisson arrivals at {report['request_rate']:g}/s{cap}"
    return f"{prompts}, {report['output_len']} output tokens, {load}, {len(report['rounds'])} interleaved rounds (medians)."


def reset_lines(report: dict) -> list[str]:
    if not report.get("reset_caches"):
        return ["Prefix caches not reset between runs."]
    if report.get("resets_refused"):
        return [
            "Prefix-cache reset UNAVAILABLE (runs went on from warm caches): " + "; ".join(report["resets_refused"])
        ]
    cleared = [reset["index_cleared"] for r in report["rounds"] for reset in r.get("resets", {}).values()]
    index = (
        "no proxy KV index to clear"
        if all(c is None for c in cleared)
        else f"the proxy's KV index cleared before {sum(c is True for c in cleared)} of {len(cleared)} runs"
    )
    return [f"Every worker's prefix cache reset before every run ({index})."]


def arrival_lines(report: dict) -> list[str]:
    """At a rate: whether serve_bench on vLLM's prompts sent at vLLM's instants in every
    round (its result files say how each run was timed)."""
    if report.get("request_rate") is None or not report["rounds"]:
        return []
    said = [r.get("arrivals", {}).get("serve_bench_vllm_prompts") for r in report["rounds"]]
    own = " serve_bench on its own prompts: its own Poisson draw." if report.get("dataset") == "random" else ""
    if all(a == "vllm" for a in said):
        return [
            "Arrivals: serve_bench on vLLM's prompts sent at the same instants as `vllm bench serve` "
            "(`--arrivals vllm`: vLLM's schedule for the seed and rate, from each run's start), in every round." + own
        ]
    return [
        "Arrivals: each tool drew its own Poisson instants (serve_bench on vLLM's prompts: "
        + ", ".join(map(str, said))
        + ")."
    ]


def markdown(report: dict) -> str:
    lines = [f"Command: `{report['command']}`", "", shape_line(report), "", *reset_lines(report)]
    lines += arrival_lines(report)
    for key, ours, title in (
        ("summary", "serve_bench", "serve_bench's own prompts (ids drawn uniformly)"),
        ("summary_vllm_prompts", "serve_bench_vllm_prompts", "serve_bench on vLLM's prompts"),
    ):
        if key not in report:
            continue
        lines += [
            "",
            f"{title} against `vllm bench serve`:",
            "",
            "| figure | serve_bench | vllm bench serve | ratio (median) | ratios per round |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, row in report[key].items():
            ratio = "" if row["ratio_median"] is None else f"{row['ratio_median']:.3f}"
            lines.append(
                f"| {name} | {row[ours]:.4g} | {row[VLLM]:.4g} | {ratio} | "
                + ", ".join(f"{r:.3f}" for r in row["ratios"])
                + " |"
            )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = [report[key] for key in ("summary", "summary_vllm_prompts") if key in report]
    names = list(dict.fromkeys(n for summary in summaries for n, row in summary.items() if row["ratios"]))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for key, color, label, shift in (
        ("summary", "tab:blue", "serve_bench's own prompts", -0.12),
        ("summary_vllm_prompts", "tab:orange", "serve_bench on vLLM's prompts", 0.12),
    ):
        for i, name in enumerate(names):
            ratios = report.get(key, {}).get(name, {}).get("ratios", [])
            ax.scatter([i + shift] * len(ratios), ratios, color=color, s=18, label=label if ratios else None)
    ax.legend(fontsize=7)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("serve_bench / vllm bench serve")
    ax.set_title("the two benchmark tools on one stack and load, per round", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def default_tokenizer() -> Path:
    from pdspec.settings import ModelSettings

    return ModelSettings().models_dir / "target"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.micro.bench_tools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="the proxy (or any OpenAI server)")
    parser.add_argument("--model", default="pdspec-tiny")
    parser.add_argument("--tokenizer", type=Path, help="for vLLM's prompts; default: the local target")
    parser.add_argument("--dataset", choices=tuple(DATASET_TOOLS), default="random")
    parser.add_argument("--input-len", type=int, default=256, help="random: prompt tokens")
    parser.add_argument("--prefix-len", type=int, help="prefix-repetition: tokens of each shared prefix")
    parser.add_argument("--suffix-len", type=int, help="prefix-repetition: tokens after it, per prompt")
    parser.add_argument(
        "--num-prefixes", type=int, help="prefix-repetition: the tenants; --num-prompts must be a multiple"
    )
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument(
        "--concurrency",
        type=int,
        help="requests in flight at most (default 2 when all are sent at once; no cap with --request-rate)",
    )
    parser.add_argument("--request-rate", type=float, help="Poisson arrivals a second (default: all at once)")
    parser.add_argument("--rounds", type=int, default=3, help="each round runs every tool once; the order rotates")
    parser.add_argument(
        "--prefill-url", action="append", help="a prefill worker (repeat): the pool's prefix-cache hit rate per run"
    )
    parser.add_argument(
        "--decode-url", action="append", help="a decode worker (repeat): the pool's acceptance length per run"
    )
    parser.add_argument(
        "--reset-caches",
        action=argparse.BooleanOptionalAction,
        help="reset the given workers' prefix caches before every run (default: on for prefix-repetition)",
    )
    parser.add_argument(
        "--vllm-default-temperature",
        action="store_true",
        help="run vLLM's tool as its defaults do, with no --temperature (the server's default, "
        "1.0: sampled) instead of --temperature 0",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.argv = list(argv)
    prefix_flags = (args.prefix_len, args.suffix_len, args.num_prefixes)
    if args.dataset == "prefix-repetition":
        if any(value is None or value < 1 for value in prefix_flags):
            parser.error("--dataset prefix-repetition needs positive --prefix-len, --suffix-len and --num-prefixes")
        if args.num_prompts % args.num_prefixes:
            # vLLM's sampler sends num_prefixes x (num_prompts // num_prefixes): fewer than asked.
            parser.error("--num-prompts must be a multiple of --num-prefixes")
        args.input_len = args.prefix_len + args.suffix_len
    elif any(value is not None for value in prefix_flags):
        parser.error("--prefix-len, --suffix-len and --num-prefixes go with --dataset prefix-repetition")
    if args.request_rate is not None and (not math.isfinite(args.request_rate) or args.request_rate <= 0):
        parser.error("--request-rate must be positive and finite")
    if args.concurrency is None and args.request_rate is None:
        args.concurrency = 2
    if args.concurrency is not None and args.concurrency < 1:
        parser.error("--concurrency must be positive")
    if args.reset_caches is None:
        args.reset_caches = args.dataset == "prefix-repetition"
    if args.reset_caches and not (args.prefill_url or args.decode_url):
        parser.error("--reset-caches needs the workers: --prefill-url / --decode-url (or --no-reset-caches)")
    args.tokenizer = args.tokenizer or default_tokenizer()
    return args


def write(report: dict, out: Path, with_plot: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_tools.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench_tools.md").write_text(markdown(report))
    if with_plot:
        plot(report, out / "bench_tools.png")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    report = run(args, on_round=lambda so_far: write(so_far, args.out, with_plot=False))
    write(report, args.out, with_plot=True)
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
