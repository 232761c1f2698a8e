"""pdspec's `loadtest.serve_bench` against vLLM's `vllm bench serve`, on one running stack.

    python -m loadtest.micro.bench_tools --url http://127.0.0.1:8000 \\
        --input-len 256 --output-len 32 --num-prompts 24 --concurrency 2 --rounds 3 \\
        --out loadtest/results/bench_tools/cpu

Both tools get the same load: `--num-prompts` random prompts of `--input-len` tokens,
`--output-len` tokens each (`ignore_eos`; vLLM sets it for its random dataset), at most
`--concurrency` in flight, all sent at once. They run interleaved (pdspec, vLLM, vLLM,
pdspec, ...) so drift hits both alike. Each round's figures are read from the tools' own
result files: serve_bench.json (client-side figures only, `--no-worker-metrics`) and
vLLM's `--save-result` JSON. Writes bench_tools.json, bench_tools.md and bench_tools.png
(each figure's ratio, serve_bench / vllm bench serve, per round) to `--out`.

What differs between the tools by design, and so is reported rather than compared:
vLLM sends text prompts (random ids decoded, then re-encoded to the length), pdspec sends
the token ids themselves; vLLM's ITL is per streamed chunk as pdspec's is, and its TPOT
is (latency - TTFT) / (tokens - 1), as pdspec's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

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


def serve_bench_argv(args, out: Path, seed: int) -> list[str]:
    return [sys.executable, "-m", "loadtest.serve_bench", "--url", args.url, "--no-worker-metrics", "--no-progress",
            "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--num-prompts", str(args.num_prompts), "--concurrency", str(args.concurrency),
            "--seed", str(seed), "--out", str(out)]  # fmt: skip


def vllm_argv(args, out: Path, seed: int) -> list[str]:
    return [sys.executable, "-m", "loadtest.micro.vllm_bench_serve", "--backend", "openai", "--base-url", args.url,
            "--endpoint", "/v1/completions", "--model", args.model, "--tokenizer", str(args.tokenizer),
            "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.concurrency), "--request-rate", "inf", "--seed", str(seed),
            "--num-warmups", "0", "--disable-tqdm", "--save-result", "--result-dir", str(out),
            "--result-filename", "vllm.json"]  # fmt: skip


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


def compare(rounds: list[dict]) -> dict[str, dict]:
    """Per figure: each tool's median over rounds, and the ratio serve_bench / vLLM of
    each round and of the medians."""
    summary = {}
    for name, _, _ in FIGURES:
        ours = [r["serve_bench"][name] for r in rounds]
        theirs = [r["vllm_bench_serve"][name] for r in rounds]
        ratios = [a / b for a, b in zip(ours, theirs) if b]
        summary[name] = {
            "serve_bench": statistics.median(ours),
            "vllm_bench_serve": statistics.median(theirs),
            "ratio_median": statistics.median(ratios) if ratios else None,
            "ratios": ratios,
        }
    return summary


def run(args) -> dict:
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as scratch:
        for index in range(args.rounds):
            # ABBA: pdspec first in even rounds, vLLM first in odd ones.
            order = ("serve_bench", "vllm_bench_serve") if index % 2 == 0 else ("vllm_bench_serve", "serve_bench")
            figures = {}
            for tool in order:
                out = Path(scratch) / f"{index}-{tool}"
                seed = args.seed + index
                run_tool(serve_bench_argv(args, out, seed) if tool == "serve_bench" else vllm_argv(args, out, seed))
                figures[tool] = pdspec_figures(out) if tool == "serve_bench" else vllm_figures(out)
                print(f"round {index + 1}/{args.rounds} {tool}: {figures[tool]['output_tokens_per_s']:.1f} out tok/s",
                      file=sys.stderr, flush=True)  # fmt: skip
            rounds.append({"round": index, "order": list(order), **figures})
    return {
        "command": "python -m loadtest.micro.bench_tools " + " ".join(args.argv),
        "url": args.url, "model": args.model, "input_len": args.input_len, "output_len": args.output_len,
        "num_prompts": args.num_prompts, "concurrency": args.concurrency,
        "rounds": rounds, "summary": compare(rounds),
    }  # fmt: skip


def markdown(report: dict) -> str:
    lines = [f"Command: `{report['command']}`", "",
             f"{report['num_prompts']} prompts of {report['input_len']} tokens, {report['output_len']} output tokens, "
             f"concurrency {report['concurrency']}, {len(report['rounds'])} interleaved rounds (medians).", "",
             "| figure | serve_bench | vllm bench serve | ratio (median) | ratios per round |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, row in report["summary"].items():
        ratio = "" if row["ratio_median"] is None else f"{row['ratio_median']:.3f}"
        lines.append(f"| {name} | {row['serve_bench']:.4g} | {row['vllm_bench_serve']:.4g} | {ratio} | "
                     + ", ".join(f"{r:.3f}" for r in row["ratios"]) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, row in report["summary"].items() if row["ratios"]]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for i, name in enumerate(names):
        ratios = report["summary"][name]["ratios"]
        ax.scatter([i] * len(ratios), ratios, color="tab:blue", s=18)
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
    parser = argparse.ArgumentParser(prog="python -m loadtest.micro.bench_tools", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--url", required=True, help="the proxy (or any OpenAI server)")
    parser.add_argument("--model", default="pdspec-tiny")
    parser.add_argument("--tokenizer", type=Path, help="for vLLM's random prompts; default: the local target")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
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
