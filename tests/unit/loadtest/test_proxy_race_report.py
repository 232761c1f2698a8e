"""The proxy race's figures: each point's mean and spread, the ratios, the flags, the
tables and the plot."""

import pytest

from loadtest.micro.proxy_race_report import markdown, plot, progress_line, summarize, worker_calls


def run(contender, rps, p50, p99, round_=0, connections=8, shape="whole", pairing="round_robin", errors=0, **extra):
    return {
        "round": round_,
        "pairing": pairing,
        "shape": shape,
        "connections": connections,
        "contender": contender,
        "rps": rps,
        "p50_ms": p50,
        "p99_ms": p99,
        "errors": errors,
        "proxy_cpu": 0.9,
        "load_cores_busy": 0.5,
        **extra,
    }


RUNS = [
    run("pdspec", 900.0, 1.0, 5.0, round_=0),
    run("vllm-router", 1000.0, 0.8, 4.0, round_=0),
    run("vllm-router", 1200.0, 0.6, 6.0, round_=1),
    run("pdspec", 1500.0, 0.5, 3.0, round_=1),
    run("pdspec", 1200.0, 0.9, 4.0, round_=2),
    run("vllm-router", 1100.0, 0.7, 5.0, round_=2),
]


def report(runs, pairings=("round_robin",), shapes=("whole",), connections=(8,)):
    return {
        "command": "python -m loadtest.proxy_race --rounds 3",
        "started": "2026-12-04 20:00:00",
        "config": {
            "rounds": 3,
            "seconds": 10,
            "connections": list(connections),
            "shapes": list(shapes),
            "pairings": {name: {"label": f"pdspec {name} / router {name}"} for name in pairings},
            "prompt_tokens": 2000,
            "prompts": 16,
            "stream_tokens": 64,
            "proxy_cpus": "0",
            "load_cpus": "1",
            "router_version": "0.1.17",
            "load_average_at_start": [0.1, 0.2, 0.3],
        },
        "runs": runs,
        "summary": summarize(runs),
    }


def test_a_point_has_each_contenders_mean_and_min_max_and_the_ratios():
    (point,) = summarize(RUNS)
    ours, theirs = point["contenders"]["pdspec"], point["contenders"]["vllm-router"]
    assert ours["rps"] == {"mean": 1200.0, "min": 900.0, "max": 1500.0, "n": 3}
    assert theirs["rps"] == {"mean": 1100.0, "min": 1000.0, "max": 1200.0, "n": 3}
    assert ours["p99_ms"]["min"] == 3.0 and ours["p99_ms"]["max"] == 5.0
    assert point["ratios"]["rps"] == pytest.approx(1200 / 1100)
    assert point["ratios"]["p50_ms"] == pytest.approx(0.8 / 0.7)
    assert ours["runs"] == 3 and ours["errors"] == 0 and ours["flagged_runs"] == 0


def test_points_are_kept_apart_and_in_the_order_they_ran():
    runs = RUNS + [run("pdspec", 50.0, 9.0, 90.0, connections=256), run("pdspec", 70.0, 9.0, 90.0, shape="stream")]
    points = [(p["shape"], p["connections"]) for p in summarize(runs)]
    assert points == [("whole", 8), ("whole", 256), ("stream", 8)]
    lone = summarize(runs)[1]
    assert lone["contenders"]["pdspec"]["rps"]["mean"] == 50.0 and lone["ratios"]["rps"] is None  # no router run


def test_a_run_with_errors_or_without_a_rate_is_flagged_and_left_out_of_what_it_lacks():
    runs = RUNS + [run("pdspec", 800.0, 1.0, 5.0, round_=3, errors=4), run("pdspec", None, None, None, round_=4)]
    (point,) = summarize(runs)
    ours = point["contenders"]["pdspec"]
    assert ours["runs"] == 5 and ours["flagged_runs"] == 2 and ours["errors"] == 4
    assert ours["rps"]["n"] == 4 and ours["rps"]["min"] == 800.0  # the run without a rate is not a zero
    table = markdown(report(runs))
    assert "pdspec: 4 in 2/5 runs **FLAGGED**" in table
    assert "FLAGGED" in progress_line(runs[-1]) and "no rate" in progress_line(runs[-1])


def test_the_table_shows_spread_and_ratios_per_pairing_and_shape():
    table = markdown(report(RUNS))
    assert "## pdspec round_robin / router round_robin, whole" in table
    row = next(line for line in table.splitlines() if line.startswith("| 8 |"))
    assert "1,200 (900..1,500)" in row and "1,100 (1,000..1,200)" in row
    assert "| 1.09 |" in row  # req/s ratio
    assert row.endswith("| 0 |")  # no errors
    assert "python -m loadtest.proxy_race --rounds 3" in table


def test_worker_calls_are_averaged_per_pairing_shape_and_contender_with_missing_kinds_as_zero():
    runs = [
        run("pdspec", 1.0, 1.0, 1.0, worker_calls_per_request={"decode": {"decode": 1.0, "tokenize": 1.0}}),
        run("pdspec", 1.0, 1.0, 1.0, worker_calls_per_request={"decode": {"decode": 1.0}}),
        run("pdspec", 1.0, 1.0, 1.0, shape="stream", worker_calls_per_request={"decode": {"decode_stream": 1.0}}),
    ]
    calls = worker_calls(runs)
    assert calls[("round_robin", "whole", "pdspec")] == {"decode.decode": 1.0, "decode.tokenize": 0.5}
    assert calls[("round_robin", "stream", "pdspec")] == {"decode.decode_stream": 1.0}
    assert "| round_robin | whole | pdspec | decode.decode 1.00, decode.tokenize 0.50 |" in markdown(report(runs))


def test_the_plot_is_written(tmp_path):
    path = tmp_path / "race.png"
    assert plot(report(RUNS), path)
    assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"
