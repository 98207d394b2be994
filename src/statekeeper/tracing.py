"""OpenTelemetry tracing: statekeeper's spans, and W3C trace context in and out.

Runs, steps, model calls, tool calls, approval waits and store operations are spans
(see ``docs/tracing.md``) when the ``otel`` extra (opentelemetry-api) is installed and
the application configured a tracer provider (the SDK's, or a vendor's). statekeeper
only asks the API for its tracer (`get_tracer`); it never configures a provider.

Tracing costs nothing otherwise: ``import statekeeper`` does not import opentelemetry;
the first run imports it once, and with no provider configured (the API's default proxy)
or the API missing, `get_tracer` is None and the runner makes no span at all.
`set_enabled` turns statekeeper's spans off even when a provider is configured.

Trace context is W3C ``traceparent``: `inject` writes the current one into a carrier
(HTTP headers, a message), `extract` reads one, and `continued` makes it the current
context for a block, so a server can accept ``traceparent`` on a request and answer with
the run's. A run stores its traceparent in its checkpoint, so resuming it in another
process, days later, continues the same trace.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from statekeeper.errors import InvalidInputError
from statekeeper.stores.base import (
    EventLogStore,
    RecordStore,
    SessionStore,
    TranscriptStore,
    WrappingStore,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, Tracer

    from statekeeper.stores.base import Store

__all__ = [
    "TRACER_NAME",
    "DeferredSpans",
    "TracedStore",
    "continued",
    "deferred_store_spans",
    "extract",
    "get_tracer",
    "inject",
    "set_enabled",
    "traced",
    "traceparent",
]

TRACER_NAME = "statekeeper"
"""The instrumentation scope of statekeeper's spans."""

_StoreT = TypeVar("_StoreT", bound="Store")

_enabled = True
_missing = False  # opentelemetry-api is not installed (tried once)
_module: ModuleType | None = None
_cached: tuple[object, Tracer] | None = None  # (provider, its tracer)


def _api() -> ModuleType | None:
    """``opentelemetry.trace``, imported on first use; None when it is not installed."""
    global _module, _missing
    if _module is None and not _missing:
        try:
            _module = importlib.import_module("opentelemetry.trace")
        except ImportError:
            _missing = True
    return _module


def set_enabled(enabled: bool) -> None:
    """Turn statekeeper's spans on (the default) or off for this process.

    Off, `get_tracer` is None whatever provider is configured; trace context helpers
    (`inject`, `extract`) keep working.
    """
    global _enabled
    if not isinstance(enabled, bool):
        raise InvalidInputError(f"set_enabled takes True or False, got {enabled!r}")
    _enabled = enabled


def get_tracer() -> Tracer | None:
    """statekeeper's tracer from the global tracer provider, or None when tracing is off.

    Off means: `set_enabled` (False), opentelemetry-api not installed, or no provider
    configured (the API's proxy or no-op provider: its spans would record nothing).
    Cheap enough to ask once per run.
    """
    global _cached
    api = _api() if _enabled else None
    if api is None:
        return None
    provider = api.get_tracer_provider()
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    if isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider):
        return None
    tracer: Tracer = provider.get_tracer(TRACER_NAME, _version())
    _cached = (provider, tracer)
    return tracer


def _version() -> str | None:
    try:
        return metadata.version("statekeeper")
    except metadata.PackageNotFoundError:
        return None


# -- W3C trace context ---------------------------------------------------------------


def _propagator() -> Any:
    module = importlib.import_module("opentelemetry.trace.propagation.tracecontext")
    return module.TraceContextTextMapPropagator()


def extract(carrier: Mapping[str, str]) -> Context | None:
    """The context of the ``traceparent`` (and ``tracestate``) in ``carrier``, e.g. a
    request's headers (names in any case); None when it has none, it is malformed, or
    opentelemetry-api is not installed."""
    _check_carrier(carrier, "extract")
    api = _api()
    if api is None:
        return None
    lowered = {str(k).lower(): str(v) for k, v in carrier.items()}
    if "traceparent" not in lowered:
        return None
    context: Context = _propagator().extract(lowered)
    if not api.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def inject(carrier: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Write the current span's ``traceparent`` (and ``tracestate``) into ``carrier`` (a
    new dict when None) and return it; nothing is written when no span is current."""
    if carrier is not None:
        _check_carrier(carrier, "inject", writable=True)
    out: MutableMapping[str, str] = {} if carrier is None else carrier
    api = _api()
    if api is not None and api.get_current_span().get_span_context().is_valid:
        _propagator().inject(out)
    return out


def _check_carrier(carrier: object, call: str, *, writable: bool = False) -> None:
    if isinstance(carrier, Mapping) and (not writable or hasattr(carrier, "__setitem__")):
        return
    kind = "a writable mapping" if writable else "a mapping"
    raise InvalidInputError(
        f"{call} takes {kind} of header names to values (a dict, or a request's "
        f"headers), got {type(carrier).__name__}"
    )


def traceparent() -> str | None:
    """The current span's W3C ``traceparent``; None when no span is current."""
    api = _api()
    if api is None:
        return None
    return format_traceparent(api.get_current_span().get_span_context())


@contextlib.contextmanager
def continued(carrier: Mapping[str, str] | None) -> Iterator[Context | None]:
    """Make the ``traceparent`` in ``carrier`` the current context inside the block, so
    runs started or resumed there are its children; without one, nothing changes.

    A server wraps its handler's runner calls in ``with continued(request.headers):``.
    """
    context = extract(carrier) if carrier is not None else None
    if context is None:
        yield None
        return
    attach = importlib.import_module("opentelemetry.context")
    token = attach.attach(context)
    try:
        yield context
    finally:
        attach.detach(token)


def format_traceparent(span_context: SpanContext) -> str | None:
    """A valid span context as a W3C ``traceparent`` (version 00); None if invalid."""
    if not span_context.is_valid:
        return None
    flags = int(span_context.trace_flags)
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{flags:02x}"


def context_of(parent: str | None) -> Context | None:
    """The context whose (remote) span is the one a stored ``traceparent`` names."""
    return extract({"traceparent": parent}) if parent else None


def current_span_id() -> str | None:
    """The id (16 hex digits) of the current span if it records, for event payloads."""
    api = _api() if _enabled else None
    if api is None:
        return None
    span = api.get_current_span()
    if not span.is_recording():
        return None
    return f"{span.get_span_context().span_id:016x}"


# -- store operations ----------------------------------------------------------------


class TracedStore(WrappingStore):
    """A store whose operations (the methods of the `Store` protocol) each run in a span,
    ``statekeeper.store <operation>`` with ``db.system.name`` and ``db.operation.name``;
    anything else (``url``, a backend's own methods) passes through untraced.

    Made by `traced`; a `Runner` made while a tracer provider is configured wraps its
    store in one.
    """

    def __init__(self, store: Store, tracer: Tracer) -> None:
        self.wrapped = store
        self._tracer = tracer
        module = type(store).__module__.split(".")
        self._system = module[2] if module[:2] == ["statekeeper", "stores"] else module[0]


@dataclass
class DeferredSpans:
    """Store operations whose spans wait for their parent (`deferred_store_spans`)."""

    ops: list[tuple[str, dict[str, Any], int, int, str | None]] = field(default_factory=list)
    """Each operation's span name, attributes, start and end (ns) and error type."""
    active: bool = True

    def replay(self, tracer: Tracer, parent: Span) -> None:
        """Make the spans of the operations so far, as children of ``parent``; the
        operations from now on make their spans as usual."""
        self.active = False
        context = _api_or_fail().set_span_in_context(parent)
        for name, attributes, start, end, error in self.ops:
            span = tracer.start_span(name, context=context, attributes=attributes, start_time=start)
            if error is not None:
                span.set_attribute("error.type", error)
                span.set_status(_api_or_fail().StatusCode.ERROR, error)
            span.end(end_time=end)
        self.ops.clear()


_deferred: ContextVar[DeferredSpans | None] = ContextVar("statekeeper_deferred", default=None)


@contextlib.contextmanager
def deferred_store_spans() -> Iterator[DeferredSpans]:
    """Inside the block, a `TracedStore`'s operations record their spans instead of
    starting them, until `DeferredSpans.replay` makes them children of a span opened
    once its parent is known (an approval's span goes in the run's trace, which only
    the checkpoint the approval loads tells)."""
    deferred = DeferredSpans()
    token = _deferred.set(deferred)
    try:
        yield deferred
    finally:
        _deferred.reset(token)


def _api_or_fail() -> ModuleType:
    api = _api()
    assert api is not None  # spans were made: the API is there
    return api


def _operation(name: str) -> Callable[..., Awaitable[Any]]:
    async def operation(self: TracedStore, *args: Any, **kwargs: Any) -> Any:
        attributes = {"db.system.name": self._system, "db.operation.name": name}
        deferred = _deferred.get()
        if deferred is not None and deferred.active:
            start, error = time.time_ns(), None
            try:
                return await getattr(self.wrapped, name)(*args, **kwargs)
            except BaseException as exc:
                error = type(exc).__name__
                raise
            finally:
                op = (f"statekeeper.store {name}", attributes, start, time.time_ns(), error)
                deferred.ops.append(op)
        with self._tracer.start_as_current_span(f"statekeeper.store {name}", attributes=attributes):
            return await getattr(self.wrapped, name)(*args, **kwargs)

    operation.__name__ = operation.__qualname__ = name
    return operation


# Defined on the class, not found through __getattr__: runtime protocol checks
# (``isinstance(s, Store)``) look at the class from Python 3.12 on.
for _name in sorted(
    name
    for part in (SessionStore, TranscriptStore, RecordStore, EventLogStore)
    for name, value in vars(part).items()
    if not name.startswith("_") and inspect.iscoroutinefunction(value)
):
    setattr(TracedStore, _name, _operation(_name))


def traced(store: _StoreT) -> _StoreT:
    """``store`` with a span around each of its operations (``statekeeper.store
    <method>``), or ``store`` itself when tracing is off (`get_tracer` is None) or it is
    traced already."""
    tracer = get_tracer()
    if tracer is None or isinstance(store, TracedStore):
        return store
    return cast("_StoreT", TracedStore(store, tracer))
