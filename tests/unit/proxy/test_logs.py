"""Request ids in logs, and OpenTelemetry spans exported over real OTLP/HTTP to a
stand-in collector (the exporter, batching and protobuf are the real ones)."""

import json
import logging

import httpx
from fastapi import FastAPI, Request
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.responses import Response

from pdspec.settings import ProxySettings
from proxy.logs import JsonFormatter
from tests.standin import StandinBehaviour, ThreadServer, create_standin, proxy_server

BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}


def collector(spans: list):
    app = FastAPI()

    @app.post("/v1/traces")
    async def traces(request: Request):
        export = ExportTraceServiceRequest.FromString(await request.body())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
        return Response(b"", media_type="application/x-protobuf")

    return app


def attributes(span) -> dict:
    return {a.key: a.value.string_value or a.value.int_value for a in span.attributes}


def test_spans_for_prefill_handoff_and_decode_share_the_request_trace():
    spans, behaviour = [], StandinBehaviour()
    with ThreadServer(collector(spans)) as otlp, ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(
            prefill_urls=[worker.url], decode_urls=[worker.url], observability={"otlp_traces_endpoint": otlp.url}
        )
        with proxy_server(settings) as proxy:
            response = httpx.post(proxy.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "trace-me"})
            assert response.status_code == 200
        # leaving the proxy flushes its span batch to the collector
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {"pdspec.request", "prefill", "handoff", "decode"}
    root = by_name["pdspec.request"]
    assert attributes(root)["pdspec.request_id"] == "trace-me"
    assert attributes(root)["http.response.status_code"] == 200
    for name in ("prefill", "handoff", "decode"):
        assert by_name[name].trace_id == root.trace_id
        assert by_name[name].parent_span_id == root.span_id
    assert by_name["prefill"].end_time_unix_nano <= by_name["handoff"].start_time_unix_nano
    # Each leg carried its own span as traceparent, so a traced vLLM joins the trace.
    prefill_header, decode_header = (h["traceparent"] for h in behaviour.headers)
    assert prefill_header.split("-")[1] == root.trace_id.hex()
    assert prefill_header.split("-")[2] == by_name["prefill"].span_id.hex()
    assert decode_header.split("-")[2] == by_name["decode"].span_id.hex()


def test_incoming_traceparent_becomes_the_parent():
    spans, behaviour = [], StandinBehaviour()
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with ThreadServer(collector(spans)) as otlp, ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(
            prefill_urls=[worker.url], decode_urls=[worker.url], observability={"otlp_traces_endpoint": otlp.url}
        )
        with proxy_server(settings) as proxy:
            httpx.post(proxy.url + "/v1/completions", json=BODY, headers={"traceparent": parent})
    root = next(span for span in spans if span.name == "pdspec.request")
    assert root.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    assert root.parent_span_id.hex() == "b7ad6b7169203331"


def test_no_exporter_means_no_trace_headers():
    behaviour = StandinBehaviour()
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(prefill_urls=[worker.url], decode_urls=[worker.url])
        with proxy_server(settings) as proxy:
            httpx.post(proxy.url + "/v1/completions", json=BODY)
    assert all("traceparent" not in h for h in behaviour.headers)


def test_access_log_has_a_line_per_request_with_its_request_id(caplog):
    behaviour = StandinBehaviour()
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(
            prefill_urls=[worker.url], decode_urls=[worker.url], observability={"access_log": True}
        )
        with proxy_server(settings) as proxy, caplog.at_level(logging.INFO, logger="pdspec.proxy"):
            httpx.post(proxy.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "log-me"})
            httpx.post(proxy.url + "/v1/completions", content=b"{", headers={"X-Request-Id": "bad-one"})
    lines = {r.request_id: r for r in caplog.records if getattr(r, "request_id", None)}
    assert "-> 200" in lines["log-me"].getMessage()
    assert "-> 400" in lines["bad-one"].getMessage()


def test_failed_requests_are_logged_even_without_the_access_log(caplog):
    behaviour = StandinBehaviour()
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(prefill_urls=[worker.url], decode_urls=[worker.url])
        with proxy_server(settings) as proxy, caplog.at_level(logging.INFO, logger="pdspec.proxy"):
            httpx.post(proxy.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "fine"})
            httpx.post(proxy.url + "/v1/completions", content=b"{", headers={"X-Request-Id": "broken"})
    ids = [getattr(r, "request_id", None) for r in caplog.records]
    assert "broken" in ids and "fine" not in ids


def test_json_log_lines_carry_the_request_id():
    record = logging.LogRecord("pdspec.proxy", logging.INFO, __file__, 1, "POST %s -> %d", ("/x", 200), None)
    record.request_id = "abc"
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == "abc" and line["message"] == "POST /x -> 200" and line["level"] == "info"


def test_reference_cycles_are_collected_on_the_proxys_interval():
    """The proxy turns Python's automatic collector off (its request path makes no
    cycles) and collects on a timer instead; cycles from rarer paths still go."""
    import gc
    import threading
    import weakref

    behaviour = StandinBehaviour()
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(prefill_urls=[worker.url], decode_urls=[worker.url], gc_interval_s=0.2)
        with proxy_server(settings):
            assert not gc.isenabled()
            collected = threading.Event()

            class Node:
                pass

            node = Node()
            node.self = node  # a cycle: only the collector can free it
            weakref.finalize(node, collected.set)
            del node
            assert collected.wait(5)
    assert gc.isenabled()  # given back when the proxy stops
