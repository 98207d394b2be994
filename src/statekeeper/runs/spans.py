"""The OpenTelemetry spans of runs: one per drive, step, model call, tool call and wait.

A run's first drive (`Runner.start`) opens the run span, ``invoke_agent <agent>``: a
child of the caller's current span, if any. Its W3C traceparent is stored in the run
state (`TraceState.traceparent`) and checkpointed with it, and ``trace_id`` becomes the
span's trace id. Every later drive (`Runner.resume`, in any process, at any time) opens
its own ``invoke_agent`` span as a *child of that stored run span*, so the whole run is
one trace; the caller's span at resume time, if any, is added as a link. Under a drive:

    invoke_agent <agent>              the drive; statekeeper.run.resumed on resumes
      statekeeper.step                one per step (statekeeper.turn)
        chat <model>                  the step's model call (`ModelCall`), gen_ai.* usage
        execute_tool <tool>           each tool call that ran in the step
        statekeeper.approval_wait     from the hold to the decision (made at settle time)
      execute_tool <tool>             calls an approval released, run when resuming

An approval or rejection made outside a drive (`Runner.approve` in another process, the
CLI) is one ``statekeeper.approval`` span in the run's trace, under the step that held
the call, with the store operations of loading and saving the decision as its children
(`decision_span`); the caller's own span, if any, is a link.

A delegated child run's span is a child of the span current where `Runner.delegate` is
called (the parent's tool call, inside its step); called outside the parent's drive,
of the parent's last step. With tracing off (`statekeeper.tracing.get_tracer` is None)
none of this runs: `RunTrace` is None and the tool helpers return at once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from statekeeper import tracing
from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.messages import ToolCallBlock
from statekeeper.runs.agent import ModelCall
from statekeeper.runs.state import RunState, TraceState

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "DecisionTrace",
    "RunTrace",
    "child_parent",
    "decision_span",
    "drive_span",
    "failed",
    "tool_span",
    "wait_spans",
]


def _otel() -> Any:
    return tracing._api()


class RunTrace:
    """The spans of one drive of a run, under its ``invoke_agent`` span."""

    def __init__(self, tracer: Tracer, span: Span, state: RunState | None = None) -> None:
        self.tracer, self.span = tracer, span
        self.state = state
        self.step_span: Span | None = None

    def adopt(self, state: RunState) -> None:
        """Make ``state`` this drive's run; a run never traced gets this span's trace."""
        self.state = state
        trace = state.trace
        if trace.traceparent is None:
            context = self.span.get_span_context()
            trace.traceparent = tracing.format_traceparent(context)
            trace.trace_id = f"{context.trace_id:032x}"
        self.span.set_attribute("gen_ai.conversation.id", state.session_id)
        self.span.set_attribute("statekeeper.run.delegate_level", state.delegate_level)

    def current(self) -> AbstractContextManager[Any]:
        """Make the drive's span current (runs may be driven in a lane's own task)."""
        use: AbstractContextManager[Any] = _otel().use_span(
            self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )
        return use

    @contextlib.contextmanager
    def step(self, state: RunState) -> Iterator[None]:
        """A step's span, current for the step (the agent's own spans nest under it)."""
        context = _otel().set_span_in_context(self.span)
        attributes = {"statekeeper.run.id": state.run_id, "gen_ai.agent.name": state.agent}
        with self.tracer.start_as_current_span(
            "statekeeper.step", context=context, attributes=attributes
        ) as span:
            self.step_span = span
            try:
                yield
            finally:
                span.set_attribute("statekeeper.turn", state.turn)
                span.set_attribute("statekeeper.run.status", str(state.status))
                self.step_span = None

    def step_id(self) -> str | None:
        """The current step span's id (16 hex digits), kept as `TraceState.current_span`."""
        if self.step_span is None:
            return None
        return f"{self.step_span.get_span_context().span_id:016x}"

    def model_call(self, call: ModelCall, agent: str, started_ns: int) -> None:
        """The span of a model call the step reported, ``chat <model>``, made when the
        step returned: it ends now and began ``latency`` ago (else when the step did)."""
        end = time.time_ns()
        start = started_ns if call.latency is None else end - int(call.latency * 1e9)
        usage = call.usage
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": call.model,
            "gen_ai.agent.name": agent,
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "statekeeper.usage.cost": call.cost,
        }
        if usage.cache_read_tokens:
            attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
        if usage.cache_write_tokens:
            attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
        if usage.reasoning_tokens:
            attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
        kind = _otel().SpanKind.CLIENT
        span = self.tracer.start_span(
            f"chat {call.model}", kind=kind, attributes=attributes, start_time=start
        )
        span.end(end_time=end)

    def finish(self) -> None:
        """Record how the drive left the run."""
        state = self.state
        if state is None:
            return
        self.span.set_attribute("statekeeper.run.status", str(state.status))
        self.span.set_attribute("statekeeper.turn", state.turn)
        if state.status == AgentStatus.ERROR and state.error is not None:
            self.span.set_attribute("error.type", state.error.type)
            self.span.set_status(_otel().StatusCode.ERROR, state.error.message[:200])


@contextlib.contextmanager
def drive_span(*, agent: str, run_id: str, trace: TraceState | None) -> Iterator[RunTrace | None]:
    """The span of a start (``trace`` None) or a resume of a run (see the module)."""
    tracer = tracing.get_tracer()
    if tracer is None:
        yield None
        return
    api = _otel()
    stored = tracing.context_of(trace.traceparent) if trace is not None else None
    links = []
    if stored is not None:  # the caller's span links to the run's trace, not its parent
        ambient = api.get_current_span().get_span_context()
        if ambient.is_valid:
            links.append(api.Link(ambient, {"statekeeper.link": "resumed_by"}))
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "statekeeper.run.id": run_id,
        "statekeeper.run.resumed": trace is not None,
    }
    with tracer.start_as_current_span(
        f"invoke_agent {agent}", context=stored, links=links, attributes=attributes
    ) as span:
        run = RunTrace(tracer, span)
        try:
            yield run
        finally:
            run.finish()


def child_parent(parent: RunState) -> AbstractContextManager[Any]:
    """Where a delegated child run's span goes: the current span when it is in the
    parent's trace (the parent's tool call), else the parent's last step (or run) span."""
    api = tracing._api() if tracing.get_tracer() is not None else None
    if api is None:
        return contextlib.nullcontext()
    current = api.get_current_span().get_span_context()
    if current.is_valid and f"{current.trace_id:032x}" == parent.trace.trace_id:
        return contextlib.nullcontext()
    stored = _traceparent_of(parent.trace)
    return tracing.continued({"traceparent": stored} if stored else None)


def _traceparent_of(trace: TraceState) -> str | None:
    """The traceparent of the run's last step span, else of its run span."""
    parent = trace.traceparent
    step = trace.current_span
    if parent is None:
        return None
    if step is not None and len(step) == 16 and trace.trace_id == parent[3:35]:
        return f"00-{trace.trace_id}-{step}-{parent[-2:]}"
    return parent


def _step_context(trace: TraceState) -> Context | None:
    return tracing.context_of(_traceparent_of(trace))


def tool_span(call: ToolCallBlock) -> AbstractContextManager[Span | None]:
    """The span of a tool call, ``execute_tool <tool>``, current while it runs (a
    null context yielding None when tracing is off)."""
    tracer = tracing.get_tracer()
    if tracer is None:
        return contextlib.nullcontext()
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
    }
    return tracer.start_as_current_span(f"execute_tool {call.name}", attributes=attributes)


def failed(span: Span | None, error_type: str, message: str) -> None:
    """Mark a tool call's span as failed: ``error.type`` and the status' description."""
    if span is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(_otel().StatusCode.ERROR, message[:200])


def wait_spans(state: RunState) -> None:
    """A ``statekeeper.approval_wait`` span per call that waited for a human decision,
    from its hold to its decision, under the step that held it (from the checkpoint)."""
    tracer = tracing.get_tracer()
    if tracer is None:
        return
    context = _step_context(state.trace)
    decisions = {d.call_id: d for d in state.decisions}
    for waiting in state.interruptions:
        decision = decisions.get(waiting.call_id)
        if decision is None or decision.decided_by == "policy":
            continue
        attributes: dict[str, Any] = {
            "gen_ai.tool.name": waiting.tool,
            "gen_ai.tool.call.id": waiting.call_id,
            "statekeeper.run.id": state.run_id,
            "statekeeper.approval.approved": decision.approved,
        }
        if decision.decided_by:
            attributes["statekeeper.approval.decided_by"] = decision.decided_by
        span = tracer.start_span(
            "statekeeper.approval_wait",
            context=context,
            attributes=attributes,
            start_time=_ns(waiting.requested_at),
        )
        span.end(end_time=max(_ns(decision.decided_at), _ns(waiting.requested_at)))


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1e9)


class DecisionTrace:
    """The ``statekeeper.approval`` span of one decision (see `decision_span`)."""

    def __init__(self, tracer: Tracer, deferred: tracing.DeferredSpans) -> None:
        self.tracer, self.deferred = tracer, deferred
        self.attributes: dict[str, Any] = {}
        self.started = time.time_ns()
        self.span: Span | None = None
        self._use: AbstractContextManager[Any] | None = None

    def adopt(self, state: RunState | None) -> None:
        """Open the span in ``state``'s trace (None: the run could not be loaded, the
        span is the caller's child), from when the decision began; the store operations
        so far become its children, and it is current from now on."""
        if self.span is not None:
            return
        api = _otel()
        links = []
        ambient = api.get_current_span().get_span_context()
        context = _step_context(state.trace) if state is not None else None
        if context is not None and ambient.is_valid:
            links.append(api.Link(ambient, {"statekeeper.link": "decided_in"}))
        self.span = span = self.tracer.start_span(
            "statekeeper.approval",
            context=context,
            links=links,
            attributes=self.attributes,
            start_time=self.started,
        )
        self.deferred.replay(self.tracer, span)
        self._use = api.use_span(span, end_on_exit=False)
        self._use.__enter__()

    def close(self, error: BaseException | None) -> None:
        if self.span is None:
            self.adopt(None)
        assert self.span is not None
        assert self._use is not None
        if error is not None:
            failed(self.span, type(error).__name__, str(error))
        self._use.__exit__(None, None, None)
        self.span.end()


@contextlib.contextmanager
def decision_span(
    run_id: str, call_id: str, *, approved: bool, by: str | None
) -> Iterator[DecisionTrace | None]:
    """The span of a decision on ``call_id`` of ``run_id``: call `DecisionTrace.adopt`
    with the run's state as soon as it is loaded (its trace says where the span goes);
    the store operations before are kept until then. None when tracing is off."""
    tracer = tracing.get_tracer()
    if tracer is None:
        yield None
        return
    with tracing.deferred_store_spans() as deferred:
        trace = DecisionTrace(tracer, deferred)
        trace.attributes = {
            "statekeeper.run.id": run_id,
            "gen_ai.tool.call.id": call_id,
            "statekeeper.approval.approved": approved,
        }
        if by:
            trace.attributes["statekeeper.approval.decided_by"] = by
        error: BaseException | None = None
        try:
            yield trace
        except BaseException as exc:
            error = exc
            raise
        finally:
            trace.close(error)
