"""Finished spans as plain JSON data, and the queries the tracing tests make of them.

Shared by the tests and by ``otel_app.py`` (the subprocess writes its spans with
`span_record`, the test reads them back).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def reset_trace_globals() -> None:
    """Forget the global tracer provider (test-only: the API has no public way)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()  # type: ignore[attr-defined]


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as plain JSON data (what the subprocesses write to a file)."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent": f"{span.parent.span_id:016x}" if span.parent else None,
        "parent_trace": f"{span.parent.trace_id:032x}" if span.parent else None,
        "kind": span.kind.name,
        "status": span.status.status_code.name,
        "description": span.status.description,
        "attributes": dict(span.attributes or {}),
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "start": span.start_time,
        "end": span.end_time,
    }


def records(memory: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [span_record(s) for s in memory.get_finished_spans()]


def only(spans: list[dict[str, Any]], name: str, **attributes: Any) -> dict[str, Any]:
    """The one span called ``name`` with these attribute values."""
    found = [
        s
        for s in spans
        if s["name"] == name and all(s["attributes"].get(k) == v for k, v in attributes.items())
    ]
    assert len(found) == 1, (name, attributes, [s["name"] for s in spans])
    return found[0]


def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def under(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    """The spans whose parent is ``parent`` (same trace)."""
    return [
        s for s in spans if s["parent"] == parent["span_id"] and s["trace_id"] == parent["trace_id"]
    ]
