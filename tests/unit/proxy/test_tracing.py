"""proxy/tracing.py: with no OTLP endpoint, `NO_TRACE` and no OpenTelemetry at all; with
one, a `pdspec.request` server span per request (request id and endpoint as attributes,
the HTTP status at the end, an error status from 500 on), child spans for the legs, each
leg's `traceparent` for its worker, and an incoming `traceparent` as the parent.

Spans go to opentelemetry-sdk's in-memory exporter: handed to `RequestTrace` as its
tracer, or put in place of the OTLP exporter that `Tracing` builds (so its endpoint is
checked without a collector). The export over real OTLP/HTTP is in
tests/unit/test_proxy_observability.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import trace_exporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy.tracing import NO_TRACE, RequestTrace, Tracing

REPO = Path(__file__).resolve().parents[3]
PARENT_TRACE, PARENT_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


@pytest.fixture
def exporter():
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test")
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict:
    spans = exporter.get_finished_spans()
    assert len({s.name for s in spans}) == len(spans), [s.name for s in spans]
    return {s.name: s for s in spans}


def traceparent(headers: dict) -> tuple[str, str, bool]:
    """Trace id, parent span id and the sampled flag of a W3C traceparent header."""
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert version == "00"
    return trace_id, span_id, bool(int(flags, 16) & 1)


# Off: no endpoint


@pytest.mark.parametrize("endpoint", [None, ""])
def test_no_endpoint_means_the_no_op_trace(endpoint):
    tracing = Tracing(endpoint)
    assert not tracing.enabled
    request = tracing.begin("rid", "completions", f"00-{PARENT_TRACE}-{PARENT_SPAN}-01")
    assert request is NO_TRACE
    span = request.start("prefill", worker="http://127.0.0.1:8100")
    assert span is None
    assert request.headers(span) == {}  # no traceparent for the workers
    request.end(span, error="boom")
    request.finish(500)
    tracing.shutdown()


def test_no_endpoint_never_imports_opentelemetry():
    """Nothing here touches OpenTelemetry: tracing off costs no import (a fresh process)."""
    script = """
import sys
from proxy.tracing import Tracing
tracing = Tracing(None)
request = tracing.begin("rid", "chat", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
span = request.start("decode")
request.headers(span)
request.end(span, "boom")
request.finish(502)
tracing.shutdown()
print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# On: RequestTrace with an in-memory exporter


def test_the_request_span_carries_the_request_id_and_ends_at_finish(tracer, exporter):
    request = RequestTrace(tracer, "rid-1", "chat", None)
    assert exporter.get_finished_spans() == ()  # open until the reply is done
    request.finish(200)
    (root,) = exporter.get_finished_spans()
    assert root.name == "pdspec.request" and root.kind == SpanKind.SERVER
    assert root.parent is None
    assert dict(root.attributes) == {
        "pdspec.request_id": "rid-1",
        "pdspec.endpoint": "chat",
        "http.response.status_code": 200,
    }
    assert root.status.status_code == StatusCode.UNSET


@pytest.mark.parametrize(
    "status, error", [(200, False), (400, False), (429, False), (499, False), (500, True), (502, True), (503, True)]
)
def test_an_error_status_from_500_on(tracer, exporter, status, error):
    RequestTrace(tracer, "rid", "completions", None).finish(status)
    (root,) = exporter.get_finished_spans()
    assert root.attributes["http.response.status_code"] == status
    assert (root.status.status_code == StatusCode.ERROR) is error


def test_legs_are_children_of_the_request_span(tracer, exporter):
    request = RequestTrace(tracer, "rid", "completions", None)
    prefill = request.start("prefill", **{"pdspec.worker": "http://127.0.0.1:8100"})
    request.end(prefill)
    handoff = request.start("handoff")
    decode = request.start("decode")
    request.end(handoff)
    request.end(decode, error="decode worker answered 500")
    request.end(None)  # a leg that never started
    request.finish(502)
    spans = by_name(exporter)
    assert set(spans) == {"pdspec.request", "prefill", "handoff", "decode"}
    root = spans["pdspec.request"]
    for name in ("prefill", "handoff", "decode"):
        assert spans[name].context.trace_id == root.context.trace_id
        assert spans[name].parent.span_id == root.context.span_id
    assert spans["prefill"].attributes["pdspec.worker"] == "http://127.0.0.1:8100"
    assert spans["prefill"].status.status_code == StatusCode.UNSET
    assert spans["decode"].status.status_code == StatusCode.ERROR
    assert spans["decode"].status.description == "decode worker answered 500"


def test_each_leg_sends_its_own_span_as_traceparent(tracer, exporter):
    request = RequestTrace(tracer, "rid", "completions", None)
    prefill = request.start("prefill")
    prefill_headers = request.headers(prefill)
    root_headers = request.headers(None)  # no leg span: the request's own
    request.end(prefill)
    request.finish(200)
    spans = by_name(exporter)
    root = spans["pdspec.request"]
    assert set(prefill_headers) == {"traceparent"}
    assert traceparent(prefill_headers) == (
        f"{root.context.trace_id:032x}",
        f"{spans['prefill'].context.span_id:016x}",
        True,
    )
    assert traceparent(root_headers)[:2] == (f"{root.context.trace_id:032x}", f"{root.context.span_id:016x}")


def test_an_incoming_traceparent_is_the_parent(tracer, exporter):
    request = RequestTrace(tracer, "rid", "completions", f"00-{PARENT_TRACE}-{PARENT_SPAN}-01")
    leg = request.start("decode")
    headers = request.headers(leg)
    request.end(leg)
    request.finish(200)
    root = by_name(exporter)["pdspec.request"]
    assert f"{root.context.trace_id:032x}" == PARENT_TRACE
    assert f"{root.parent.span_id:016x}" == PARENT_SPAN and root.parent.is_remote
    assert traceparent(headers)[0] == PARENT_TRACE  # the workers join the caller's trace


def test_an_unsampled_caller_is_followed(tracer, exporter):
    """The caller chose not to sample: nothing is recorded, and the workers are told."""
    request = RequestTrace(tracer, "rid", "completions", f"00-{PARENT_TRACE}-{PARENT_SPAN}-00")
    leg = request.start("prefill")
    headers = request.headers(leg)
    request.end(leg)
    request.finish(200)
    assert exporter.get_finished_spans() == ()
    assert traceparent(headers)[0] == PARENT_TRACE and traceparent(headers)[2] is False


@pytest.mark.parametrize("incoming", ["garbage", "", f"00-{'0' * 32}-{PARENT_SPAN}-01", f"00-{PARENT_TRACE}-zz-01"])
def test_a_malformed_traceparent_starts_a_new_trace(tracer, exporter, incoming):
    request = RequestTrace(tracer, "rid", "completions", incoming)
    request.finish(200)
    (root,) = exporter.get_finished_spans()
    assert root.parent is None and root.context.trace_id != 0
    assert f"{root.context.trace_id:032x}" != PARENT_TRACE


# On: Tracing with an endpoint


class ExporterFactory:
    """Stands in for OTLPSpanExporter: records the endpoint, exports to memory."""

    def __init__(self) -> None:
        self.endpoints: list[str] = []
        self.exporters: list[InMemorySpanExporter] = []

    def __call__(self, endpoint: str) -> InMemorySpanExporter:
        self.endpoints.append(endpoint)
        self.exporters.append(InMemorySpanExporter())
        return self.exporters[-1]


@pytest.fixture
def otlp(monkeypatch) -> ExporterFactory:
    factory = ExporterFactory()
    monkeypatch.setattr(trace_exporter, "OTLPSpanExporter", factory)
    return factory


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:4318",
        "http://127.0.0.1:4318/",
        "http://127.0.0.1:4318/v1/traces",
        "http://127.0.0.1:4318/v1/traces/",
    ],
)
def test_the_endpoint_is_the_collectors_traces_path(otlp, endpoint):
    tracing = Tracing(endpoint)
    assert tracing.enabled
    tracing.shutdown()
    assert otlp.endpoints == ["http://127.0.0.1:4318/v1/traces"]


def test_spans_are_flushed_at_shutdown_under_the_service_name(otlp):
    tracing = Tracing("http://127.0.0.1:4318", service_name="pdspec-proxy-test")
    request = tracing.begin("rid-7", "completions", None)
    assert isinstance(request, RequestTrace)
    leg = request.start("prefill")
    request.end(leg)
    request.finish(200)
    tracing.shutdown()  # spans are batched: shutdown sends what is still queued
    spans = otlp.exporters[0].get_finished_spans()
    assert sorted(s.name for s in spans) == ["pdspec.request", "prefill"]
    assert {s.resource.attributes["service.name"] for s in spans} == {"pdspec-proxy-test"}
    root = next(s for s in spans if s.name == "pdspec.request")
    assert root.attributes["pdspec.request_id"] == "rid-7"


def test_each_tracing_has_its_own_provider_not_the_global_one(otlp):
    """Apps built in one process (tests) must not share exporters."""
    global_provider = trace.get_tracer_provider()
    first, second = Tracing("http://127.0.0.1:4318"), Tracing("http://127.0.0.1:4319")
    first.begin("one", "completions", None).finish(200)
    second.begin("two", "chat", None).finish(200)
    first.shutdown()
    second.shutdown()
    assert trace.get_tracer_provider() is global_provider
    ids = [[s.attributes["pdspec.request_id"] for s in e.get_finished_spans()] for e in otlp.exporters]
    assert ids == [["one"], ["two"]]
