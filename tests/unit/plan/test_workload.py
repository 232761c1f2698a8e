"""Workloads (pdspec/plan/workload.py): Poisson arrivals that are a function of the seed, the
same requests time-scaled at another rate, and workload files refused whole when they are not
one."""

import json

import pytest

from pdspec.plan import workload


def test_poisson_arrivals_are_the_seeds_and_scale_with_the_rate():
    slow = workload.poisson(1.0, 2000, [(100, 10)], seed=4)
    assert slow == workload.poisson(1.0, 2000, [(100, 10)], seed=4)
    assert slow != workload.poisson(1.0, 2000, [(100, 10)], seed=5)
    fast = workload.poisson(4.0, 2000, [(100, 10)], seed=4)
    assert [r.arrival_s for r in fast] == pytest.approx([r.arrival_s / 4 for r in slow])
    assert slow[-1].arrival_s / len(slow) == pytest.approx(1.0, rel=0.1)  # about one a second
    assert all(b.arrival_s > a.arrival_s for a, b in zip(slow, slow[1:]))


def test_shapes_are_drawn_as_pairs():
    shapes = [(100, 10), (2000, 3)]
    requests = workload.poisson(10.0, 500, shapes, seed=0)
    assert {(r.isl, r.osl) for r in requests} == set(shapes)
    assert workload.shapes_of(requests[:2]) == [(requests[0].isl, requests[0].osl), (requests[1].isl, requests[1].osl)]


@pytest.mark.parametrize("rate, count, shapes", [(0, 10, [(1, 1)]), (1, 0, [(1, 1)]), (1, 10, [])])
def test_a_workload_needs_a_rate_a_count_and_a_shape(rate, count, shapes):
    with pytest.raises(ValueError):
        workload.poisson(rate, count, shapes, seed=0)


def test_a_workload_file_loads_in_arrival_order(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps([{"arrival_s": 2, "isl": 5, "osl": 6}, {"arrival_s": 1, "isl": 7, "osl": 8}]))
    assert workload.load(path) == [workload.Request(1, 7, 8), workload.Request(2, 5, 6)]


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "{}",
        "not json",
        '[{"arrival_s": 0, "isl": 0, "osl": 1}]',
        '[{"arrival_s": 0, "isl": 1, "osl": 1, "x": 1}]',
    ],
    ids=["empty", "object", "not-json", "isl-0", "unknown-key"],
)
def test_anything_else_is_refused_naming_the_file(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(workload.WorkloadError, match="bad.json"):
        workload.load(path)
