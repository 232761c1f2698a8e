"""kv_hold_cpu's readings: the worker's process by its port, its engine features' states
from /metrics, and a process tree's CPU in cores."""

import os

from fastapi import FastAPI
from starlette.responses import PlainTextResponse

from loadtest.serving.kv_hold_cpu import features, server_pid, tree_cores
from tests.standin import ThreadServer

METRICS = """# HELP pdspec_engine_feature pdspec's engine features
pdspec_engine_feature{feature="kv_hold_wait",reason="",state="on"} 1.0
pdspec_engine_feature{feature="short_spin",reason="not a CPU build, so vLLM's spin kept",state="off"} 1.0
pdspec_engine_feature{feature="k0_rule",reason="",state="off"} 0.0
"""


def test_features_port_owner_and_cores():
    app = FastAPI()
    app.get("/metrics")(lambda: PlainTextResponse(METRICS))
    with ThreadServer(app) as server:
        assert features(server.url) == {"kv_hold_wait": "on", "short_spin": "off"}  # a 0 series is a past state
        assert server_pid(server.url) == os.getpid()
    busy = tree_cores({"me": os.getpid()}, 0.2)
    assert set(busy) == {"me"} and busy["me"] >= 0
