"""`pdspec bench`: start the stack of a profile, run a named workload, stop the stack;
every result in one folder.

    pdspec bench deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml --workload seed --out results/eagle3
    pdspec bench --workload cpu-seed --out loadtest/results/serve_bench-cpu   # the local CPU stack

A workload (loadtest/serving/workloads.py; `--list` shows them) is serve_bench's arguments plus
the stack variants to run them on (the seed: prefill max_num_batched_tokens 512 and
2048, one stack each). Several profiles give one stack per profile and variant.
`--together` starts every stack at once and benchmarks them one after another (one
start-up wait instead of several; on GPUs give each stack its share of memory with
`--set`, and `--alternate-gpus` puts every other 1P1D stack's prefill worker on the
decode worker's GPU, so the prefill workers of two stacks do not share one).
Anything after `--` goes to serve_bench as is (`-- --num-prompts 64`).

Writes DIR/bench.json and DIR/bench.md (all stacks), DIR/bench_latency.png (all stacks'
latency curves), and each stack's own serve_bench outputs under DIR/<stack>/.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from loadtest.serving import serve_bench, serve_report
from loadtest.serving.stack import Stack, load_settings, stack_ports, stop_all, wait_ready
from loadtest.serving.workloads import WORKLOADS


def parse_set(items: list[str]) -> dict[str, object]:
    overrides: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. prefill.gpu_memory_utilization=0.4")
        try:
            overrides[key] = json.loads(value)  # numbers, true/false, lists
        except ValueError:
            overrides[key] = value
    return overrides


def plan_stacks(args: argparse.Namespace, run_root: Path) -> list[Stack]:
    workload = WORKLOADS[args.workload]
    profiles = [Path(p) for p in args.profiles] or [None]
    stacks = []
    chosen = list(dict.fromkeys(args.variants or workload.variants))  # a name given twice is one stack
    unknown = sorted(set(chosen) - set(workload.variants))
    if unknown:
        raise SystemExit(f"--variants {' '.join(unknown)}: {args.workload} has {', '.join(workload.variants)}")
    for profile in profiles:
        for variant in chosen:
            variant_overrides = workload.variants[variant]
            index = len(stacks)
            base = profile.stem if profile is not None else "local"
            name = base if variant == "default" else f"{base}.{variant}"
            overrides = {**variant_overrides, **parse_set(args.set or []), **stack_ports(args.base_port, index)}
            if args.alternate_gpus and index % 2 == 1:
                settings = load_settings(profile, overrides)
                overrides["prefill.cuda_visible_devices"] = settings.decode.cuda_visible_devices
                overrides["decode.cuda_visible_devices"] = settings.prefill.cuda_visible_devices
            stacks.append(Stack(name, profile, overrides, run_root / name))
    return stacks


def target_vocab_size(stack: Stack) -> int | None:
    from pdspec.worker.launch import resolve_model_paths

    target, _ = resolve_model_paths(stack.settings.model)
    try:
        return json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    except (OSError, KeyError, ValueError):
        return None


def bench_stack(stack: Stack, args: argparse.Namespace, deadline: float | None) -> dict:
    urls = stack.urls()
    argv = [
        *WORKLOADS[args.workload].serve_args,
        *args.serve_args,
        "--url",
        urls["url"],
        "--prefill-url",
        urls["prefill_url"],
        "--decode-url",
        urls["decode_url"],
        "--run-dir",
        str(stack.run_dir),
        "--label",
        stack.name,
        "--out",
        str(args.out / stack.name),
    ]
    if deadline is not None:
        argv += ["--deadline", str(deadline)]
    if args.no_progress:
        argv.append("--no-progress")
    vocab = target_vocab_size(stack)
    if vocab and "--vocab-size" not in args.serve_args:
        argv += ["--vocab-size", str(vocab)]
    sb_args = serve_bench.parse_args(argv)
    if sb_args.ab and stack.settings.layout == "colocated":
        raise RuntimeError("--ab switches a prefill worker's policy; a colocated stack has none")
    report = serve_bench.run_benchmark(sb_args)
    serve_report.write(report, args.out / stack.name)
    return report


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def markdown(summary: dict) -> str:
    lines = [
        f"# pdspec bench: workload `{summary['workload']}`",
        "",
        summary["description"],
        "",
        f"`{summary['command']}`",
        "",
    ]
    rows = [(s["name"], row) for s in summary["stacks"] if s.get("report") for row in s["report"]["ab_summary"]]
    if rows:
        lines += [
            "| stack | load | always prefill tok/s | auto prefill tok/s | auto vs always "
            "| K=0 / proposals (auto) | K=0 / proposals (always) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, r in rows:
            lines.append(
                # None: no pair of phases saturated the prefill worker (serve_report.ab_summary)
                f"| {name} | {r['load']} | {_rate(r['always_prefill_tokens_per_s'])} "
                f"| {_rate(r['auto_prefill_tokens_per_s'])} | {serve_report.pct_text(r['auto_vs_always_pct'], 2)} "
                f"| {r['k0_proposals']['auto']:,} / {r['proposals']['auto']:,} "
                f"| {r['k0_proposals']['always']:,} / {r['proposals']['always']:,} |"
            )
        lines.append("")
    for s in summary["stacks"]:
        lines += [
            f"## {s['name']}",
            "",
            f"profile `{s['profile']}`, overrides `{json.dumps(s['overrides'])}`, "
            f"ready after {s.get('ready_s', 0):.0f} s",
            "",
        ]
        if s.get("report"):
            lines.append(serve_report.markdown(s["report"]))
        if s.get("error"):
            lines += ["Failed:", "", "```", s["error"][-4000:], "```", ""]
    return "\n".join(lines) + "\n"


def write(summary: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(summary, indent=1))
    (out / "bench.md").write_text(markdown(summary))
    reports = [s["report"] for s in summary["stacks"] if s.get("report")]
    several_loads = any(len({ph["load"] for ph in r["phases"]}) > 1 for r in reports)
    if len(reports) > 1 and several_loads:  # curves need more than one load level
        try:
            serve_report.plot_latency(reports, out / "bench_latency.png")
        except ImportError:
            pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdspec bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profiles", nargs="*", help="profile TOML files (none: pdspec's defaults, the local CPU stack)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), help="named workload")
    parser.add_argument("--out", type=Path, help="results folder")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument(
        "--variants",
        nargs="+",
        metavar="NAME",
        help="only these of the workload's stacks (the seed: mbt512, mbt2048; see --list)",
    )
    parser.add_argument("--together", action="store_true", help="start every stack at once, then bench each")
    parser.add_argument(
        "--alternate-gpus", action="store_true", help="every other stack: prefill and decode workers swap GPUs"
    )
    parser.add_argument("--set", nargs="+", metavar="KEY=VALUE", help="settings for every stack (prefill.port=...)")
    parser.add_argument(
        "--base-port", type=int, default=8000, help="stack i: proxy base+i, workers base+10+i, base+20+i"
    )
    parser.add_argument("--run-root", type=Path, help="run folders (logs, caches); default: a new temporary folder")
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds for the stacks to be ready")
    parser.add_argument(
        "--budget-s", type=float, help="wall-clock budget from start: phases that would begin after it are skipped"
    )
    parser.add_argument("--no-progress", action="store_true")
    return parser


class Terminated(Exception):
    pass


def _terminate(signum, frame) -> None:
    raise Terminated()


def main(argv: list[str]) -> int:
    if "--" in argv:
        cut = argv.index("--")
        argv, serve_args = argv[:cut], argv[cut + 1 :]
    else:
        serve_args = []
    parser = build_parser()
    args = parser.parse_args(argv)
    args.serve_args = serve_args
    if args.list:
        for name, workload in sorted(WORKLOADS.items()):
            print(f"{name}: {workload.description}\n    variants: {', '.join(workload.variants)}")
        return 0
    if not args.workload or not args.out:
        parser.error("--workload and --out are required")
    # A SIGTERM (`timeout`, a supervisor) must still stop the stacks and write results.
    signal.signal(signal.SIGTERM, _terminate)
    started = time.time()
    deadline = started + args.budget_s if args.budget_s else None
    run_root = args.run_root or Path(tempfile.mkdtemp(prefix="pdspec-bench-"))
    stacks = plan_stacks(args, run_root)
    summary = {
        "workload": args.workload,
        "description": WORKLOADS[args.workload].description,
        "command": "pdspec bench " + " ".join(argv + (["--", *serve_args] if serve_args else [])),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "stacks": [{"name": s.name, "profile": str(s.profile), "overrides": s.overrides} for s in stacks],
    }

    def say(message: str) -> None:
        print(f"pdspec bench: [{time.time() - started:5.0f} s] {message}", file=sys.stderr, flush=True)

    def run_one(stack: Stack, record: dict, stack_deadline: float | None) -> None:
        try:
            record["report"] = bench_stack(stack, args, stack_deadline)
        except Terminated:
            record["error"] = "terminated (SIGTERM) while benchmarking"
            raise
        except Exception:  # one stack's failure must not lose the others' results
            record["error"] = traceback.format_exc() + "\n" + stack.log_tail()
            say(f"stack {stack.name} failed:\n{record['error'][-3000:]}")
        write(summary, args.out)

    groups = [stacks] if args.together else [[s] for s in stacks]
    code = 0
    try:
        for group in groups:
            for stack in group:
                stack.start()
                say(f"starting stack {stack.name} (log {stack.log_path})")
            try:
                ready_s = wait_ready(group, args.ready_timeout, say)
            except RuntimeError as exc:
                for stack in group:
                    summary["stacks"][stacks.index(stack)]["error"] = f"{exc}\n{stack.log_tail()}"
                write(summary, args.out)
                say(str(exc))
                return 1
            for position, stack in enumerate(group):
                record = summary["stacks"][stacks.index(stack)]
                record["ready_s"] = ready_s[stack.name]
                # An equal share of the time left for each stack still to run, so a tight
                # budget trims every stack's phases rather than dropping the last stack.
                share = None if deadline is None else time.time() + (deadline - time.time()) / (len(group) - position)
                say(f"benchmarking {stack.name}")
                run_one(stack, record, share)
            stop_all(group)
    except Terminated:
        say("terminated: stopping the stacks")
        code = 1
    finally:
        stop_all(stacks)
        write(summary, args.out)
        say(f"done; results in {args.out}")
    print(markdown(summary))
    return 1 if code or any(s.get("error") for s in summary["stacks"]) else 0
