"""The OpenTelemetry SDK for the tracing tests: a tracer provider exporting to memory.

The library never configures a provider; the tests do, as an application would. The
API's global provider can be set once per process, so the fixture resets the API's
globals afterwards, as opentelemetry-test-utils' ``reset_trace_globals`` does, and
every other test of the suite runs with tracing off again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_spans import reset_trace_globals


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider, set globally, whose finished spans collect here."""
    reset_trace_globals()
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    try:
        yield memory
    finally:
        provider.shutdown()
        reset_trace_globals()
