"""The proxy profile's accounting (loadtest/micro/proxy_profile.py): py-spy's collapsed
stacks read back, each sample charged to its innermost frame of a layer, and the report's
table; the profile itself needs wrk and ptrace rights and runs by hand."""

from loadtest.micro import proxy_profile

CLIENT_WRITE = (
    'process 7:"python -m pdspec.cli proxy";run_forever (asyncio/base_events.py:600)'
    ";send (proxy/upstream/client.py:210);write (asyncio/selector_events.py:1070)"
)
UVICORN_WRITE = (
    'process 7:"python -m pdspec.cli proxy";run_forever (asyncio/base_events.py:600)'
    ";send (uvicorn/protocols/http/httptools_impl.py:500);write (asyncio/selector_events.py:1070)"
)
METRICS_IN_FLOW = (
    'process 7:"python -m pdspec.cli proxy";serve (proxy/flow/disagg.py:120)'
    ";inc (.venv/lib/python3.11/site-packages/prometheus_client/metrics.py:300)"
)
LOOP_ONLY = 'process 7:"python -m pdspec.cli proxy";_run_once (asyncio/base_events.py:1900)'
# uvicorn.run's own frames sit outside the loop on every stack: not charged to uvicorn.
IN_UVLOOP = (
    'process 7:"python -m pdspec.cli proxy";run (uvicorn/server.py:67)'
    ";run (asyncio/runners.py:190);Runner.run (asyncio/runners.py:118)"
)
COLLAPSED = f"{CLIENT_WRITE} 5\n{UVICORN_WRITE} 3\n{METRICS_IN_FLOW} 1\n{LOOP_ONLY} 1\nnot a stack line\n"
WITH_LOOP = COLLAPSED + f"{IN_UVLOOP} 10\n"


def test_collapsed_stacks_are_read_back_with_their_counts():
    stacks = proxy_profile.parse_collapsed(COLLAPSED)
    assert [count for _, count in stacks] == [5, 3, 1, 1]
    assert stacks[0][0][-1] == "write (asyncio/selector_events.py:1070)"


def test_a_frame_belongs_to_the_layer_of_its_file():
    assert proxy_profile.frame_file("send (proxy/upstream/client.py:210)") == "proxy/upstream/client.py"
    assert proxy_profile.layer_of("send (proxy/upstream/client.py:210)") == "worker client"
    assert proxy_profile.layer_of("cycle (uvicorn/protocols/http/httptools_impl.py:1)").startswith("uvicorn")
    assert proxy_profile.layer_of("write (asyncio/selector_events.py:1070)") is None
    assert proxy_profile.layer_of('process 7:"python -m pdspec.cli proxy"') is None


def test_a_sample_is_charged_to_the_innermost_layer_that_asked_for_it():
    charged = proxy_profile.charge(proxy_profile.parse_collapsed(COLLAPSED))
    assert charged["samples"] == 10
    assert charged["self"] == {
        "worker client": 0.5,  # its socket writes are its own
        "uvicorn (HTTP protocol, ASGI cycle)": 0.3,
        "metrics": 0.1,  # inside the flow, but the metric's own cost
        proxy_profile.EVENT_LOOP: 0.1,
    }
    assert charged["inclusive"]["flow"] == 0.1 and charged["inclusive"]["metrics"] == 0.1
    assert charged["top_functions"][0] == {"frame": "write (asyncio/selector_events.py:1070)", "share": 0.8}


def test_the_table_has_a_row_per_layer_and_a_column_per_shape():
    charged = proxy_profile.charge(proxy_profile.parse_collapsed(COLLAPSED))
    shapes = [
        {"shape": "whole", "rps": 5000.0, "cpu_us_per_request": 190.0, **charged},
        {"shape": "stream", "rps": 900.0, "cpu_us_per_request": 1100.0, **charged},
    ]
    report = {"command": "c", "started": "t", "config": {"pairing": "round_robin", "connections": 8, "rate": 500}}
    table = proxy_profile.markdown({**report, "shapes": shapes})
    assert "| worker client | 50.0% (50%) | 50.0% (50%) |" in table
    assert "| proxy CPU per request (µs) | 190.0 | 1100.0 |" in table


def test_frames_outside_the_event_loop_are_charged_to_no_layer():
    charged = proxy_profile.charge(proxy_profile.parse_collapsed(WITH_LOOP))
    assert charged["samples"] == 20
    assert charged["self"][proxy_profile.EVENT_LOOP] == 0.55  # the loop's C code, and the one stack with no layer
    assert charged["inclusive"]["uvicorn (HTTP protocol, ASGI cycle)"] == 0.15  # only its writes
