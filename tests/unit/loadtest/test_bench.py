"""`pdspec bench`: stacks planned from profiles, workloads and overrides; markdown summary.
The real run (stacks started, benchmarked, stopped) is recorded in
loadtest/results/serve_bench-cpu/ and the e2e test runs serve_bench itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.serving import bench
from loadtest.serving.stack import env_name, load_settings, stack_ports
from loadtest.serving.workloads import WORKLOADS
from pdspec.supervisor import check_ports, client_url

PROFILES = Path(__file__).resolve().parents[3] / "deploy" / "profiles"


def test_seed_workload_is_the_seed():
    seed = WORKLOADS["seed"]
    args = bench.serve_bench.parse_args(["--url", "http://x", *seed.serve_args])
    assert (args.input_len, args.output_len, args.num_prompts, args.concurrency, args.phases, args.ab) == (
        8192,
        8,
        128,
        [32],
        3,
        True,
    )
    assert [v["prefill.max_num_batched_tokens"] for v in seed.variants.values()] == [512, 2048]
    for workload in WORKLOADS.values():  # every preset parses
        bench.serve_bench.parse_args(["--url", "http://x", *workload.serve_args])


def test_env_names_and_set_values():
    assert env_name("prefill.max_num_batched_tokens") == "PDSPEC_PREFILL__MAX_NUM_BATCHED_TOKENS"
    assert env_name("layout") == "PDSPEC_LAYOUT"
    assert bench.parse_set(
        [
            "prefill.gpu_memory_utilization=0.4",
            "prefill.cuda_visible_devices=1",
            'decode.extra_vllm_args=["--x"]',
            "layout=colocated",
        ]
    ) == {
        "prefill.gpu_memory_utilization": 0.4,
        "prefill.cuda_visible_devices": 1,
        "decode.extra_vllm_args": ["--x"],
        "layout": "colocated",
    }
    with pytest.raises(SystemExit):
        bench.parse_set(["novalue"])


def test_settings_come_from_profile_and_overrides_not_the_shell(monkeypatch):
    monkeypatch.setenv("PDSPEC_PREFILL__PORT", "1")  # a stray setting in this shell
    s = load_settings(
        PROFILES / "dummy/qwen3-8b-eagle3-1p1d.toml",
        {"prefill.max_num_batched_tokens": 2048, "decode.gpu_memory_utilization": 0.4},
    )
    assert s.prefill.port == 8100 and s.prefill.max_num_batched_tokens == 2048
    assert s.decode.gpu_memory_utilization == 0.4 and s.prefill.gpu_memory_utilization == 0.9
    assert s.model.method == "eagle3"
    import os

    assert os.environ["PDSPEC_PREFILL__PORT"] == "1" and "PDSPEC_CONFIG" not in os.environ  # restored


def _args(*argv: str):
    args = bench.build_parser().parse_args(list(argv))
    args.serve_args = []
    return args


def test_seed_plan_two_stacks_on_alternating_gpus(tmp_path):
    profile = str(PROFILES / "dummy/qwen3-8b-dflash-1p1d.toml")
    args = _args(
        profile,
        "--workload",
        "seed",
        "--out",
        str(tmp_path),
        "--together",
        "--alternate-gpus",
        "--set",
        "prefill.gpu_memory_utilization=0.4",
        "decode.gpu_memory_utilization=0.4",
        "--base-port",
        "19400",
    )
    stacks = bench.plan_stacks(args, tmp_path)
    assert [s.name for s in stacks] == ["qwen3-8b-dflash-1p1d.mbt512", "qwen3-8b-dflash-1p1d.mbt2048"]
    first, second = (s.settings for s in stacks)
    assert (first.prefill.max_num_batched_tokens, second.prefill.max_num_batched_tokens) == (512, 2048)
    assert (first.prefill.cuda_visible_devices, first.decode.cuda_visible_devices) == ("0", "1")
    assert (second.prefill.cuda_visible_devices, second.decode.cuda_visible_devices) == ("1", "0")
    assert first.prefill.gpu_memory_utilization == second.decode.gpu_memory_utilization == 0.4
    ports = [
        {
            first.proxy.port,
            first.prefill.port,
            first.decode.port,
            first.prefill.side_channel_port,
            first.decode.side_channel_port,
        }
        for first in (first, second)
    ]
    assert len(ports[0] | ports[1]) == 10 and all(19400 <= p < 19700 for p in ports[0] | ports[1])
    assert stacks[1].run_dir == tmp_path / "qwen3-8b-dflash-1p1d.mbt2048"
    assert stacks[0].urls() == {
        "url": "http://127.0.0.1:19400",
        "prefill_url": "http://127.0.0.1:19410",
        "decode_url": "http://127.0.0.1:19420",
    }


def test_variants_pick_some_of_a_workloads_stacks(tmp_path):
    profile = str(PROFILES / "dummy/qwen3-8b-eagle3-1p1d.toml")
    args = _args(profile, "--workload", "seed", "--out", str(tmp_path), "--variants", "mbt512")
    [stack] = bench.plan_stacks(args, tmp_path)
    assert stack.name == "qwen3-8b-eagle3-1p1d.mbt512" and stack.settings.prefill.max_num_batched_tokens == 512
    twice = _args(profile, "--workload", "seed", "--out", str(tmp_path), "--variants", "mbt2048", "mbt512", "mbt2048")
    assert [s.name.split(".")[-1] for s in bench.plan_stacks(twice, tmp_path)] == ["mbt2048", "mbt512"]
    with pytest.raises(SystemExit, match="mbt1024.*mbt512, mbt2048"):
        bench.plan_stacks(
            _args(profile, "--workload", "seed", "--out", str(tmp_path), "--variants", "mbt1024"), tmp_path
        )


def test_colocated_stack_is_one_server(tmp_path):
    args = _args(
        str(PROFILES / "dummy/qwen3-8b-eagle3-1p1d.toml"),
        str(PROFILES / "dummy/qwen3-8b-eagle3-colocated.toml"),
        "--workload",
        "latency",
        "--out",
        str(tmp_path),
        "--base-port",
        "19400",
    )
    p1d1, colocated = bench.plan_stacks(args, tmp_path)
    assert colocated.settings.layout == "colocated"
    assert colocated.urls() == {
        "url": "http://127.0.0.1:19401",
        "prefill_url": "http://127.0.0.1:19401",
        "decode_url": "http://127.0.0.1:19401",
    }
    assert client_url(p1d1.settings) == "http://127.0.0.1:19400"


def test_colocated_layout_plans_one_child_and_no_proxy(tmp_path):
    from pdspec.supervisor import plan_children

    s = load_settings(None, {"layout": "colocated", "colocated.port": 19480, "run_dir": str(tmp_path)})
    children = plan_children(s)
    assert [c.name for c in children] == ["colocated worker"]
    assert children[0].health_url == "http://127.0.0.1:19480/health"
    assert "--kv-transfer-config" not in children[0].argv
    assert [c.name for c in plan_children(load_settings(None, {"run_dir": str(tmp_path)}))] == [
        "prefill worker",
        "decode worker",
        "proxy",
    ]


def test_summary_markdown_has_the_cross_stack_table():
    row = {
        "load": "concurrency 32",
        "always_prefill_tokens_per_s": 27000.0,
        "auto_prefill_tokens_per_s": 27567.0,
        "auto_vs_always_pct": 2.1,
        "pair_ratios": [1.02],
        "k0_proposals": {"auto": 96, "always": 0},
        "proposals": {"auto": 96, "always": 96},
        "ttft_ms_median": {},
    }
    report = {
        "label": "x",
        "command": "c",
        "url": "u",
        "model": "m",
        "num_prompts": 1,
        "input_len": 1,
        "output_len": 1,
        "phases": [],
        "ab_summary": [row],
    }
    summary = {
        "workload": "seed",
        "description": "d",
        "command": "pdspec bench",
        "stacks": [
            {"name": "eagle3.mbt512", "profile": "p", "overrides": {}, "ready_s": 130.0, "report": report},
            {"name": "eagle3.mbt2048", "profile": "p", "overrides": {}, "error": "boom"},
        ],
    }
    text = bench.markdown(summary)
    assert "| eagle3.mbt512 | concurrency 32 | 27,000 | 27,567 | +2.10% | 96 / 96 | 0 / 96 |" in text
    assert "boom" in text


def test_summary_markdown_with_no_saturated_pair():
    # serve_report.ab_summary leaves a load's figures None when no pair saturated the prefill worker.
    row = {
        "load": "concurrency 32",
        "always_prefill_tokens_per_s": None,
        "auto_prefill_tokens_per_s": None,
        "auto_vs_always_pct": None,
        "pair_ratios": [],
        "k0_proposals": {"auto": 96, "always": 0},
        "proposals": {"auto": 96, "always": 96},
        "ttft_ms_median": {},
        "pairs_used": 0,
        "excluded_pairs": 1,
    }
    report = {
        "label": "x",
        "command": "c",
        "url": "u",
        "model": "m",
        "num_prompts": 1,
        "input_len": 1,
        "output_len": 1,
        "phases": [],
        "ab_summary": [row],
    }
    summary = {
        "workload": "seed",
        "description": "d",
        "command": "pdspec bench",
        "stacks": [{"name": "eagle3.mbt512", "profile": "p", "overrides": {}, "report": report}],
    }
    assert "| eagle3.mbt512 | concurrency 32 | - | - | - | 96 / 96 | 0 / 96 |" in bench.markdown(summary)


def test_ports_pass_pdspec_ups_check_and_stacks_share_none():
    """`pdspec up` keeps four NIXL side-channel ports per worker (DP ranks) and refuses a
    clash: every stack a run plans must start (a plan 2 apart once failed them all)."""
    claimed = []
    for index in range(10):
        ports = stack_ports(8000, index)
        check_ports(load_settings(None, {**ports, "model.kv_transfer": "push"}))
        side = [ports[f"{role}.side_channel_port"] + rank for role in ("prefill", "decode") for rank in range(4)]
        events = [ports[f"{role}.kv_events_port"] + offset for role in ("prefill", "decode") for offset in (0, 1)]
        claimed += [ports["proxy.port"], ports["prefill.port"], ports["decode.port"], *side, *events]
    assert len(claimed) == len(set(claimed))


def test_cpu_profiles_compare_the_two_layouts_on_two_cores(tmp_path):
    args = _args(
        str(PROFILES / "cpu-1p1d.toml"),
        str(PROFILES / "cpu-colocated.toml"),
        "--workload",
        "cpu-latency",
        "--out",
        str(tmp_path),
    )
    p1d1, colocated = (s.settings for s in bench.plan_stacks(args, tmp_path))
    assert (p1d1.layout, p1d1.prefill.cpu_omp_threads_bind, p1d1.decode.cpu_omp_threads_bind) == ("1p1d", "0", "1")
    assert (colocated.layout, colocated.colocated.cpu_omp_threads_bind) == ("colocated", "0-1")
    assert p1d1.prefill.max_num_batched_tokens == colocated.colocated.max_num_batched_tokens == 2048


def test_together_starts_every_stack_first_and_shares_the_budget(monkeypatch, tmp_path):
    events = []
    monkeypatch.setattr(bench.Stack, "start", lambda self: events.append(("start", self.name)))
    monkeypatch.setattr(bench.Stack, "ready", lambda self: True)
    monkeypatch.setattr(bench.Stack, "running", lambda self: ("start", self.name) in events)
    monkeypatch.setattr(bench.Stack, "log_tail", lambda self, lines=40: "")
    monkeypatch.setattr(bench, "stop_all", lambda stacks: events.extend(("stop", s.name) for s in stacks))
    import time as _time

    def fake_bench(stack, args, deadline):
        events.append(("bench", stack.name, round(deadline - _time.time())))
        if stack.name.endswith("mbt2048"):
            raise RuntimeError("engine died")
        return {
            "label": stack.name,
            "command": "c",
            "url": "u",
            "model": "m",
            "num_prompts": 1,
            "input_len": 1,
            "output_len": 1,
            "phases": [],
            "ab_summary": [],
        }

    monkeypatch.setattr(bench, "bench_stack", fake_bench)
    code = bench.main(
        [
            str(PROFILES / "dummy/qwen3-8b-eagle3-1p1d.toml"),
            "--workload",
            "seed",
            "--out",
            str(tmp_path),
            "--together",
            "--budget-s",
            "100",
            "--run-root",
            str(tmp_path / "runs"),
        ]
    )
    names = ["qwen3-8b-eagle3-1p1d.mbt512", "qwen3-8b-eagle3-1p1d.mbt2048"]
    assert events[:2] == [("start", n) for n in names]  # both start before any benchmark
    assert [e[:2] for e in events[2:4]] == [("bench", n) for n in names]
    assert 45 <= events[2][2] <= 50 and 95 <= events[3][2] <= 100  # half the budget, then the rest
    assert code == 1  # one stack failed; the other's results are still written
    summary = __import__("json").loads((tmp_path / "bench.json").read_text())
    assert summary["stacks"][0]["report"]["label"] == names[0] and "engine died" in summary["stacks"][1]["error"]


def test_the_in_core_ab_alternates_its_arms_abbaabba_on_the_local_stack(tmp_path):
    args = _args("--workload", "cpu-in-core", "--out", str(tmp_path))
    stacks = bench.plan_stacks(args, tmp_path)
    arms = [s.name.split(".")[-1].rsplit("_", 1)[0] for s in stacks]
    assert arms == ["in_core", "worker_process", "worker_process", "in_core"] * 2
    for stack, arm in zip(stacks, arms):
        settings = stack.settings
        on = arm == "in_core"
        assert settings.prefill.in_core_worker is on and settings.decode.in_core_worker is on, stack.name
