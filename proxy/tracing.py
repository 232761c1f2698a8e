"""OpenTelemetry spans for each request, when an exporter is configured.

One trace per client request: a `pdspec.request` server span (its attributes carry the
request id) with children `prefill` (the prefill leg), `handoff` (prefill reply in to
the decode worker's first byte out: the KV pull over NIXL and the first decode step) and
`decode` (the decode leg, request sent to last byte). The `traceparent` of each leg goes
to its worker, so a vLLM started with `--otlp-traces-endpoint` joins the same trace.
An incoming `traceparent` makes the request span its child.

With no endpoint configured nothing here touches OpenTelemetry: `NO_TRACE` is a no-op.
"""

from __future__ import annotations

from typing import Any


class NoTrace:
    """The request trace when tracing is off: every call does nothing."""

    def start(self, name: str, **attributes: Any) -> None:
        return None

    def end(self, span: Any, error: str | None = None) -> None:
        pass

    def headers(self, span: Any) -> dict[str, str]:
        return {}

    def finish(self, status: int) -> None:
        pass


NO_TRACE = NoTrace()


class RequestTrace(NoTrace):
    def __init__(self, tracer, request_id: str, endpoint: str, traceparent: str | None) -> None:
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = tracer
        self._propagator = TraceContextTextMapPropagator()
        parent = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
        self._root = tracer.start_span(
            "pdspec.request",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"pdspec.request_id": request_id, "pdspec.endpoint": endpoint},
        )

    def _context(self, span):
        from opentelemetry import trace

        return trace.set_span_in_context(span)

    def start(self, name: str, **attributes: Any):
        return self._tracer.start_span(name, context=self._context(self._root), attributes=attributes)

    def end(self, span, error: str | None = None) -> None:
        if span is None:
            return
        if error:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def headers(self, span) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._context(span if span is not None else self._root))
        return carrier

    def finish(self, status: int) -> None:
        self._root.set_attribute("http.response.status_code", status)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            self._root.set_status(Status(StatusCode.ERROR))
        self._root.end()


class Tracing:
    """Builds a trace per request; `enabled` only with an OTLP endpoint."""

    def __init__(self, otlp_endpoint: str | None, service_name: str = "pdspec-proxy") -> None:
        self.enabled = bool(otlp_endpoint)
        self._provider = None
        self._tracer = None
        if not self.enabled:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        endpoint = otlp_endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        # A provider of our own, not the global one: apps built in one process (tests)
        # must not share exporters.
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self._tracer = self._provider.get_tracer("pdspec.proxy")

    def begin(self, request_id: str, endpoint: str, traceparent: str | None) -> NoTrace:
        if not self.enabled:
            return NO_TRACE
        return RequestTrace(self._tracer, request_id, endpoint, traceparent)

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()  # flushes spans still queued
