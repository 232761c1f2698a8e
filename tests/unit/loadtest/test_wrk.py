"""wrk for the micro benchmarks: its report parsed, its Lua script, its command line; the
script's rotation checked with the real wrk where it is installed."""

import shutil
import subprocess

import pytest

from loadtest.micro.instant_worker import InstantWorker
from loadtest.micro.wrk import parse_report, post_script, wrk_argv
from tests.standin import InstantWorkerThread

# wrk 4.1's report of a clean run, as it printed it against the instant worker.
CLEAN = """Running 1s test @ http://127.0.0.1:31201/v1/completions
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   226.01us  493.11us   8.40ms   92.30%
    Req/Sec    41.79k    12.54k   67.29k    80.00%
  Latency Distribution
     50%   50.00us
     75%  231.00us
     90%  625.00us
     99%    1.65ms
  41504 requests in 1.00s, 11.40MB read
Requests/sec:  41443.86
Transfer/sec:     11.38MB
"""

# The same shape with wrk's error lines (its printf formats) and slow percentiles.
FAILING = """Running 10s test @ http://127.0.0.1:31410/v1/completions
  1 threads and 256 connections
  Latency Distribution
     50%  812.33ms
     75%     1.20s
     90%     1.90s
     99%     2.01s
  3000 requests in 10.02s, 1.00MB read
  Socket errors: connect 0, read 7, write 2, timeout 31
  Non-2xx or 3xx responses: 12
Requests/sec:    299.40
Transfer/sec:    102.20KB
"""


def test_a_clean_report_as_numbers():
    result = parse_report(CLEAN)
    assert result["requests"] == 41504 and result["duration_s"] == pytest.approx(1.0)
    assert result["rps"] == pytest.approx(41443.86)
    assert result["p50_ms"] == pytest.approx(0.05)  # microseconds read as such
    assert result["p99_ms"] == pytest.approx(1.65)
    assert result["non_2xx"] == 0 and result["errors"] == 0
    assert result["socket_errors"] == {"connect": 0, "read": 0, "write": 0, "timeout": 0}


def test_every_error_wrk_counts_is_summed_and_seconds_are_read_as_seconds():
    result = parse_report(FAILING)
    assert result["socket_errors"] == {"connect": 0, "read": 7, "write": 2, "timeout": 31}
    assert result["non_2xx"] == 12
    assert result["errors"] == 12 + 7 + 2 + 31
    assert result["p50_ms"] == pytest.approx(812.33)
    assert result["p99_ms"] == pytest.approx(2010.0)
    assert result["duration_s"] == pytest.approx(10.02)


def test_a_report_without_figures_gives_none_rather_than_raising():
    result = parse_report("unable to connect to 127.0.0.1:31299 Connection refused\n")
    assert result["rps"] is None and result["p50_ms"] is None and result["requests"] is None
    assert result["errors"] == 0  # the caller flags a run without a rate


def test_one_body_is_wrks_static_request_several_are_formatted_once_and_sent_in_turn():
    one = post_script(['{"prompt": "a"}'])
    assert 'wrk.body = [==[{"prompt": "a"}]==]' in one and "function request" not in one
    several = post_script(['{"prompt": "a"}', '{"prompt": "b"}'])
    assert "function init" in several and "wrk.format(nil, nil, nil, body)" in several
    assert "function request" in several and "wrk.body" not in several
    assert several.index('"a"') < several.index('"b"')


def test_a_body_that_would_end_its_lua_string_is_refused():
    with pytest.raises(ValueError, match="Lua string"):
        post_script(['{"prompt": "x]==]y"}'])
    with pytest.raises(ValueError):
        post_script([])


def test_wrk_is_pinned_and_reports_its_latency_distribution():
    argv = wrk_argv("http://127.0.0.1:1/v1/completions", 64, 2, "/tmp/s.lua", "1")
    assert argv[:3] == ["taskset", "-c", "1"] and argv[3] == "wrk"
    assert {"-t1", "-c64", "-d2s", "--latency"} <= set(argv)
    assert argv[argv.index("-s") + 1] == "/tmp/s.lua" and argv[-1] == "http://127.0.0.1:1/v1/completions"
    with pytest.raises(ValueError, match="whole seconds"):  # wrk itself refuses -d0.5s
        wrk_argv("http://127.0.0.1:1/", 1, 0.5, "/tmp/s.lua", "1")


class Recording(InstantWorker):
    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    def reply(self, method, path, body):
        if method == b"POST":
            self.bodies.append(body)
        return super().reply(method, path, body)


@pytest.mark.skipif(not shutil.which("wrk"), reason="needs wrk (Debian's wrk package)")
def test_the_real_wrk_sends_the_bodies_in_turn(tmp_path):
    bodies = [f'{{"prompt": "p{i}"}}' for i in range(3)]
    script = tmp_path / "post.lua"
    script.write_text(post_script(bodies))
    worker = Recording()
    with InstantWorkerThread(worker) as thread:
        # One connection, so the order the worker sees is the order wrk sent.
        argv = wrk_argv(thread.url + "/v1/completions", 1, 1, str(script), "0")[3:]  # not pinned
        report = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    sent = [body.decode() for body in worker.bodies]
    assert len(sent) >= 6 and set(sent) == set(bodies)
    # In turn: each body is followed by the next (wrk spends the first one checking the script).
    assert all(bodies.index(b) == (bodies.index(a) + 1) % 3 for a, b in zip(sent, sent[1:]))
    assert parse_report(report)["requests"] <= len(sent)
