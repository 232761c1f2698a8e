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
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from loadtest.serving import worker_metrics

# (figure, how serve_bench's phase gives it, vLLM's result key)
FIGURES = (
    ("completed", lambda p: p["completed"], "completed"),
    ("input_tokens", lambda p: p["prompt_tokens"], "total_input_tokens"),
    ("output_tokens", lambda p: p["output_tokens"], "total_output_tokens"),
    ("duration_s", lambda p: p["duration_s"], "duration"),
    ("output_tokens_per_s", lambda p: p["output_tokens_per_s"], "output_throughput"),
    ("ttft_ms_median", lambda p: p["ttft_ms"]["median"], "median_ttft_ms"),
    ("itl_ms_median", lambda p: p["itl_ms"]["median"], "median_itl_ms"),
    ("tpot_ms_median", lambda p: p["tpot_ms"]["median"], "median_tpot_ms"),
)


TOOLS = ("vllm_bench_serve", "serve_bench", "serve_bench_vllm_prompts")
VLLM = "vllm_bench_serve"


def serve_bench_argv(args, out: Path, seed: int, dataset: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "loadtest.serve_bench",
        "--url",
        args.url,
        "--no-worker-metrics",
        "--no-progress",
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--num-prompts",
        str(args.num_prompts),
        "--concurrency",
        str(args.concurrency),
        "--dataset",
        dataset,
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
    return serve_bench_argv(args, out, seed, "uniform" if tool == "serve_bench" else "vllm-random")


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
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--num-prompts",
        str(args.num_prompts),
        "--max-concurrency",
        str(args.concurrency),
        "--request-rate",
        "inf",
        "--seed",
        str(seed),
        "--num-warmups",
        "0",
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


def vllm_figures(out: Path) -> dict[str, float]:
    result = json.loads((out / "vllm.json").read_text())
    return {name: result[key] for name, _, key in FIGURES}


def compare(rounds: list[dict], ours: str = "serve_bench") -> dict[str, dict]:
    """Per figure: each tool's median over rounds, and the ratio `ours` / vLLM's of each
    round and their median (None where vLLM's figure is 0 or missing)."""
    summary = {}
    names = [name for name, _, _ in FIGURES] + ["decode_acceptance_length"]
    for name in names:
        pairs = [(r[ours].get(name), r[VLLM].get(name)) for r in rounds]
        if all(a is None for a, _ in pairs):
            continue
        ratios = [a / b for a, b in pairs if a is not None and b]
        summary[name] = {
            ours: statistics.median(a for a, _ in pairs if a is not None),
            VLLM: statistics.median(b for _, b in pairs if b is not None),
            "ratio_median": statistics.median(ratios) if ratios else None,
            "ratios": ratios,
        }
    return summary


def run(args) -> dict:
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as scratch:
        for index in range(args.rounds):
            order = TOOLS[index % 3 :] + TOOLS[: index % 3]  # each tool first in turn
            figures = {}
            for tool in order:
                out = Path(scratch) / f"{index}-{tool}"
                before = decode_counters(args.decode_url)
                run_tool(tool_argv(tool, args, out, args.seed + index))
                after = decode_counters(args.decode_url)
                figures[tool] = vllm_figures(out) if tool == VLLM else pdspec_figures(out)
                if before is not None and after is not None:
                    accepted = worker_metrics.acceptance_length(worker_metrics.deltas(before, after))
                    if accepted is not None:
                        figures[tool]["decode_acceptance_length"] = accepted
                print(
                    f"round {index + 1}/{args.rounds} {tool}: {figures[tool]['output_tokens_per_s']:.1f} out tok/s",
                    file=sys.stderr,
                    flush=True,
                )
            rounds.append({"round": index, "order": list(order), **figures})
    return {
        "command": "python -m loadtest.micro.bench_tools " + " ".join(args.argv),
        "url": args.url,
        "model": args.model,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_prompts": args.num_prompts,
        "concurrency": args.concurrency,
        "rounds": rounds,
        "summary": compare(rounds, "serve_bench"),
        "summary_vllm_prompts": compare(rounds, "serve_bench_vllm_prompts"),
    }


def markdown(report: dict) -> str:
    lines = [
        f"Command: `{report['command']}`",
        "",
        f"{report['num_prompts']} prompts of {report['input_len']} tokens, {report['output_len']} output tokens, "
        f"concurrency {report['concurrency']}, {len(report['rounds'])} interleaved rounds (medians).",
    ]
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

    names = [n for n, row in report["summary"].items() if row["ratios"]]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for key, color, label, shift in (
        ("summary", "tab:blue", "serve_bench's own prompts", -0.12),
        ("summary_vllm_prompts", "tab:orange", "serve_bench on vLLM's prompts", 0.12),
    ):
        for i, name in enumerate(names):
            ratios = report.get(key, {}).get(name, {}).get("ratios", [])
            ax.scatter([i + shift] * len(ratios), ratios, color=color, s=18, label=label if i == 0 else None)
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.micro.bench_tools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="the proxy (or any OpenAI server)")
    parser.add_argument("--model", default="pdspec-tiny")
    parser.add_argument("--tokenizer", type=Path, help="for vLLM's random prompts; default: the local target")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="each round runs the three; the order rotates")
    parser.add_argument("--decode-url", help="the decode worker: its acceptance length over each run")
    parser.add_argument(
        "--vllm-default-temperature",
        action="store_true",
        help="run vLLM's tool as its defaults do, with no --temperature (the server's default, "
        "1.0: sampled) instead of --temperature 0",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.tokenizer = args.tokenizer or default_tokenizer()
    report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_tools.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "bench_tools.md").write_text(markdown(report))
    plot(report, args.out / "bench_tools.png")
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
