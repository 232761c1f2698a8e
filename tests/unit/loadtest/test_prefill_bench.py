"""prefill_bench's reporting: interleaving order, the table and the baseline lines."""

import json

from loadtest.engine_bench.prefill_bench import BenchResult, baseline_lines, render, rep_orders


def test_reps_alternate_the_order_of_modes():
    assert rep_orders(["auto", "full", "none"], 3) == [
        ["auto", "full", "none"],
        ["none", "full", "auto"],
        ["auto", "full", "none"],
    ]


def test_baseline_line_is_the_ratio_of_medians():
    counters = {"pdspec_k0_proposals_total": 4.0, "pdspec_proposals_total": 4.0}
    r = BenchResult(
        512,
        32,
        2048,
        tokens_per_s={"auto": [90.0, 95.0, 80.0], "full": [70.0] * 3, "none": [100.0, 100.0, 120.0]},
        counters={"auto": counters, "full": counters, "none": {}},
    )
    assert baseline_lines([r]) == ["mbt 512: k0/no-drafter: 0.900"]
    table = render([r])
    assert "| 512 | 90 | 70 | 100 |" in table
    assert "auto/none (pairs)" in table and "0.900 (0.667..0.950)" in table
    assert "4 / 4" in table


def test_no_baseline_line_without_the_plain_engine():
    r = BenchResult(
        512,
        1,
        1,
        tokens_per_s={"auto": [1.0], "always": [1.0]},
        counters={
            "auto": {"pdspec_k0_proposals_total": 1, "pdspec_proposals_total": 1},
            "always": {"pdspec_k0_proposals_total": 0, "pdspec_proposals_total": 1},
        },
    )
    assert baseline_lines([r]) == []
    assert r.ratio == 1.0


def bench_args(**overrides):
    import argparse

    from pdspec.settings import ModelSettings

    args = dict(
        models_dir=ModelSettings().models_dir,
        target=None,
        drafter=None,
        method="eagle3",
        k=3,
        gpu_memory_utilization=None,
        dummy=False,
        eager=False,
    )
    return argparse.Namespace(**{**args, **overrides})


def test_the_prefill_worker_mode_builds_the_engine_pdspec_prefill_runs(tmp_path):
    """Issue 22: the KV-only pass was measured on a bare engine while every prefill worker
    ran another one. The benchmark's engine options are the launcher's, server options aside,
    with the KV released at once."""
    from loadtest.engine_bench.engines import BENCH_KV_LEASE_S, prefill_worker_engine
    from pdspec.settings import ModelSettings, PrefillWorkerSettings
    from pdspec.worker.launch import SERVER_OPTIONS, launch_spec, option_flags

    bench = prefill_worker_engine(bench_args(eager=True), mbt=512, max_model_len=4112)
    model = ModelSettings(max_model_len=4112)
    worker = PrefillWorkerSettings(max_num_batched_tokens=512, enforce_eager=True)
    spec = launch_spec("prefill", model, worker, tmp_path)  # what `pdspec prefill` execs
    served = spec.argv[spec.argv.index("pdspec.worker.serve") + 1 :]

    options = {k: v for k, v in bench.items() if k not in ("method", "env", "kv_transfer_params")}
    lease = options["kv_transfer_config"].pop("kv_connector_extra_config")
    assert lease == {"kv_lease_duration": BENCH_KV_LEASE_S}
    assert options["kv_transfer_config"]["kv_role"] == "kv_producer"
    server_flags = {"--" + name.replace("_", "-") for name in SERVER_OPTIONS}
    # The server's own flags (--enable-scale-out among them: on by default) are not the engine's.
    assert {"--enable-prompt-tokens-details", "--enable-scale-out"} <= set(served)
    without_server = []
    skip = False
    for index, item in enumerate(served):
        if skip:
            skip = False
            continue
        if item in server_flags:
            # A flag with a value drops it too; a bare switch (--enable-scale-out) is followed by a flag.
            skip = index + 1 < len(served) and not served[index + 1].startswith("--")
            continue
        without_server.append(item)
    # The lease is the one option the benchmark sets apart (its KV released at once).
    at = without_server.index("--kv-transfer-config") + 1
    served_transfer = json.loads(without_server[at])
    assert served_transfer.pop("kv_connector_extra_config") == {"kv_lease_duration": worker.kv_lease_s}
    without_server[at] = json.dumps(served_transfer)
    assert option_flags(options) == without_server
    for name in (
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "PDSPEC_NIXL_PROGRESS_DELAY_US",
        "PDSPEC_KV_ONLY_DRAFTER",
        "PDSPEC_ROLE",
    ):
        assert bench["env"][name] == spec.env[name], name
    assert bench["kv_transfer_params"]["do_remote_decode"] is True


def test_the_no_drafter_baseline_is_the_same_worker_without_a_drafter():
    from loadtest.engine_bench.engines import prefill_worker_engine

    plain = prefill_worker_engine(bench_args(), mbt=2048, max_model_len=2064, method="none", side_channel_port=5610)
    drafter = prefill_worker_engine(bench_args(), mbt=2048, max_model_len=2064)
    assert "speculative_config" not in plain and "speculative_config" in drafter
    assert plain["kv_transfer_config"] == drafter["kv_transfer_config"]
    assert plain["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] != drafter["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]


def test_counters_sum_vllms_labelled_counters_and_keep_named_label_values_apart():
    """vLLM's counters carry model and engine labels: they are summed, not dropped (a
    keying on every label once read vLLM's preemptions as 0); the graph check's result
    label is read per value."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.samples import Sample

    from loadtest.engine_bench.engines import counter_values

    family = Metric("x", "", "counter")
    family.samples = [
        Sample("vllm:num_preemptions_total", {"model_name": "m", "engine": "0"}, 2.0),
        Sample("vllm:num_preemptions_total", {"model_name": "m", "engine": "1"}, 3.0),
        Sample("pdspec_kv_only_graph_verified_total", {"result": "equal"}, 4.0),
        Sample("pdspec_kv_only_graph_verified_total", {"result": "differ"}, 1.0),
        Sample("pdspec_proposals_total", {}, 7.0),
    ]
    values = counter_values([family])
    assert values["vllm:num_preemptions_total"] == 5.0
    assert values["pdspec_kv_only_graph_verified_total{equal}"] == 4.0
    assert values["pdspec_kv_only_graph_verified_total{differ}"] == 1.0
    assert values["pdspec_proposals_total"] == 7.0
    assert values["pdspec_k0_proposals_total"] == 0.0


def test_every_mode_is_warmed_up_before_the_timed_reps(monkeypatch):
    """On stand-in engines: each mode runs once untimed (auto and none on the full batch, the
    others on a few prompts) before the first timed rep, so no mode's first use is timed."""
    import contextlib
    import os

    from loadtest.engine_bench import prefill_bench

    runs: list[tuple[str, int]] = []

    class Engine:
        engine_pids = frozenset({os.getpid()})
        gc_pause_seconds = None
        kv_transfer_params = None

        def __init__(self, plain: bool):
            self.plain, self.kv_only, self.policy = plain, True, "auto"
            self.llm = self

        def set_kv_only(self, on):
            self.kv_only = on

        def set_policy(self, policy):
            self.policy = policy

        def generate(self, inputs, params, use_tqdm):
            mode = (
                "none" if self.plain else ("always" if self.policy == "always" else "auto" if self.kv_only else "full")
            )
            runs.append((mode, len(inputs)))

        def counters(self):
            return {
                "pdspec_kv_only_graph_verified_total{equal}": 0.0,
                "pdspec_kv_only_graph_verified_total{differ}": 0.0,
            }

        def collect(self):
            return []

        def metrics_files(self):
            return []

    @contextlib.contextmanager
    def plugin_engine(**args):
        yield Engine(plain=args.get("method") == "none")

    monkeypatch.setattr(prefill_bench, "plugin_engine", plugin_engine)
    prefill_bench.bench(
        {}, mbt=512, num_prompts=8, prompt_tokens=4, reps=2, vocab=100, modes=["auto", "full", "always", "none"]
    )
    warm_ups, timed = runs[:4], runs[4:]
    assert warm_ups == [("none", 8), ("auto", 8), ("full", 4), ("always", 4)]
    assert sorted(timed) == sorted([(m, 8) for m in ("auto", "full", "always", "none")] * 2)
