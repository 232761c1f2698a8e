"""The routing-cost micro benchmark at a tiny size: every step is timed, the plans it
times use the proxy's own ids and hit the index it filled, and it writes its report."""

import json

from loadtest.micro.routing_cost import main

STEPS = ["encode_inline", "tokenize", "block_keys", "lookup", "plan_from_ids", "plan", "route"]


def test_a_small_run_times_every_step_on_real_plans(tmp_path, capsys):
    main(["--tokens", "256", "--prompts", "3", "--iterations", "6", "--index-blocks", "128", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "routing_cost.json").read_text())
    assert list(report["steps"]) == STEPS
    assert all(step["p50_ms"] > 0 and step["p99_ms"] >= step["p50_ms"] for step in report["steps"].values())
    assert report["steps"]["plan"]["loop_cpu_p50_ms"] > 0
    assert 250 <= report["prompt_tokens_median"] <= 257  # cut at token boundaries (a BOS-less tokenizer)
    assert report["blocks_per_prompt"] == report["prompt_tokens_median"] // 16
    # The prompt's first half is held by the first prefill and decode worker only: a hit.
    half = report["blocks_per_prompt"] // 2 * 16
    for pool in ("prefill", "decode"):
        assert sorted(report["cached_tokens_sample"][pool].values()) == [0, half]
    out = capsys.readouterr().out
    assert all(f"| {step} |" in out for step in STEPS)
    assert not (tmp_path / "profile.txt").exists()
