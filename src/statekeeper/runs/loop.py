"""`RunLoop`: drives one run, step by step, until it stops; checkpoints every step.

A step: take messages others appended to the session and steering follow-ups as new
input, ask the agent for an action, apply it (tool calls through the `ToolBox` or the
`ApprovalGate`, output through the guardrails), then write the step's messages and the
checkpoint together. Before each step the loop sees a cancel request, absorbs the usage
its delegated children reported, and checks every limit (iterations, budget, tokens,
wall time): a run at a limit starts no further step (see `statekeeper.runs.limiting`).

Events tell what happened in the order it happened: a status change is published as it
happens (``running`` before the first step's events, before the tool results an
approval releases), and what the agent said (``assistant/complete``, with the model
call behind it) before the tool calls it made and the status it led to. A step whose
model call is rate limited on every auth profile pauses the run (nothing of the step
counts); `AutoCompaction` may compact the session before a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.messages import Message, Role
from statekeeper.errors import (
    InvalidInputError,
    InvalidPayloadError,
    LimitReachedError,
    StatekeeperError,
)
from statekeeper.runs.agent import (
    Action,
    Agent,
    AskInput,
    Cancel,
    Finish,
    Handoff,
    Respond,
    StepInput,
)
from statekeeper.runs.compaction import AutoCompaction
from statekeeper.runs.coordination import Coordination
from statekeeper.runs.gate import ApprovalGate
from statekeeper.runs.guardrails import Guardrails, GuardrailTripped
from statekeeper.runs.index import RunIndex
from statekeeper.runs.lifecycle import FINISHED, RunLifecycle
from statekeeper.runs.limiting import Stopwatch, reached, stop_at_limit
from statekeeper.runs.results import ReadOnlyMessages, RunResult
from statekeeper.runs.rollup import report_usage
from statekeeper.runs.spans import RunTrace
from statekeeper.runs.state import ErrorDetails, RunState
from statekeeper.runs.step import StepPaused, account, ask, said
from statekeeper.runs.store import RunStore
from statekeeper.runs.tools import ToolBox
from statekeeper.runs.why import LANE_ERRORS, PAUSE_REASONS
from statekeeper.runs.writer import CheckpointWriter
from statekeeper.runtime.lanes import LANES_CLOSED_REASON, closed_by_lanes
from statekeeper.runtime.profiles import AuthProfile, AuthProfiles
from statekeeper.sessions import SessionManager
from statekeeper.sessions.view import message_of
from statekeeper.stores.base import SessionRecord, Store

__all__ = ["ActiveRun", "RunLoop", "find_agent"]


@dataclass
class ActiveRun:
    """What a driving runner holds besides the state: never persisted as is."""

    state: RunState
    writer: CheckpointWriter
    messages: list[Message]
    """The conversation the agent sees: the session's view plus what the run added."""
    context: Any
    new_input: list[Message] = field(default_factory=list)
    added: list[Message] = field(default_factory=list)
    """Messages this call of the runner added (`RunResult.new_messages`)."""
    seen_seq: int = 0
    """The session's last seq when the run last looked (to spot others' appends)."""
    profile: AuthProfile | None = None
    """The auth profile the current step's model call used."""
    stopwatch: Stopwatch = field(default_factory=lambda: Stopwatch(time.monotonic))
    """Counts the time the run is driven into its time limit."""
    trace: RunTrace | None = None
    """The drive's spans (None: tracing is off)."""
    looked: SessionRecord | None = None
    """The session's head as read before this step (with the run's index), if it was."""


def find_agent(agents: Mapping[str, Agent], name: str) -> Agent:
    """The agent called ``name``; `InvalidInputError` naming the known ones if none."""
    try:
        return agents[name]
    except KeyError:
        raise InvalidInputError(
            f"no agent named {name!r}; known: {', '.join(sorted(agents)) or 'none'}"
        ) from None


class RunLoop:
    """The step loop of one runner's runs (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        tenant: str,
        runs: RunStore,
        agents: Mapping[str, Agent],
        tools: ToolBox,
        approvals: ApprovalGate,
        guardrails: Guardrails,
        lifecycle: RunLifecycle,
        coordination: Coordination,
        sessions: SessionManager | None = None,
        compaction: AutoCompaction | None = None,
        auth: AuthProfiles | Mapping[str, AuthProfiles] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.tenant, self.runs, self.agents = store, tenant, runs, agents
        self.tools, self.approvals, self.guardrails = tools, approvals, guardrails
        self.lifecycle, self.coordination = lifecycle, coordination
        self.sessions = sessions or SessionManager(store, tenant, max_messages=None)
        self.compaction, self.auth, self.clock = compaction, auth, clock
        self._cancel: dict[str, asyncio.Event] = {}

    def driving(self, run_id: str) -> bool:
        """Whether this loop is driving the run right now."""
        return run_id in self._cancel

    def request_cancel(self, run_id: str) -> None:
        """Make a run this loop drives stop before its next step."""
        if run_id in self._cancel:
            self._cancel[run_id].set()

    async def drive(self, active: ActiveRun) -> RunResult:
        """Drive the run until it stops, as the only run of its session.

        If its turn never comes (its lane was cleared or closed, the session lock could
        not be had), the run is left stopped and its lease released (`_never_started`).
        """
        started = False

        async def body() -> RunResult:
            nonlocal started
            started = True
            return await self._run(active)

        try:
            return await self.coordination.exclusive(self.tenant, active.state, body)
        except BaseException as exc:
            if not started:
                await self._never_started(active, exc)
            raise

    async def _never_started(self, active: ActiveRun, exc: BaseException) -> None:
        """Settle a run whose turn never came: a run never checkpointed becomes PAUSED
        (resumable, with input again, and cancellable; the input it was started with was
        not written), its ``error`` saying why when its lane was cleared or closed (see
        `statekeeper.runs.why`); any run's lease is released. Best effort: the error that
        stopped it is what the caller needs to see."""
        state = active.state
        try:
            if state.revision == 0 and state.status == AgentStatus.INITIALIZING:
                if self.lifecycle.transitions.allows(state.status, AgentStatus.PAUSED):
                    self.lifecycle.move(state, AgentStatus.PAUSED)
                if isinstance(exc, LANE_ERRORS):
                    state.error = ErrorDetails(type=type(exc).__name__, message=str(exc)[:2000])
                await active.writer.save(state)
            await active.writer.flush(state, release=True)
            await self.lifecycle.flush()
        except StatekeeperError:
            pass

    async def _run(self, active: ActiveRun) -> RunResult:
        state = active.state
        self._cancel[state.run_id] = cancel = asyncio.Event()
        active.stopwatch = Stopwatch(self.clock)
        active.stopwatch.start()
        current = active.trace.current() if active.trace else contextlib.nullcontext()
        with current:
            try:
                return await self._drive_steps(active, cancel)
            finally:
                self._cancel.pop(state.run_id, None)
                await self._end(active)

    async def _drive_steps(self, active: ActiveRun, cancel: asyncio.Event) -> RunResult:
        state = active.state
        try:
            if await self._begin(active):
                await self._steps(active, cancel)
            return RunResult(state, active.added)
        except BaseException as exc:
            if closed_by_lanes(exc) and state.status not in FINISHED:
                with contextlib.suppress(StatekeeperError):  # the cancellation goes on
                    await self._cancelled(active, LANES_CLOSED_REASON)
            expected = isinstance(exc, LimitReachedError | asyncio.CancelledError)
            if not expected and state.status not in FINISHED:
                await self._fail(active, exc)
            raise

    async def _begin(self, active: ActiveRun) -> bool:
        """Get a loaded run going: False if it stops before its first step."""
        state = active.state
        resumed = state.status != AgentStatus.INITIALIZING
        if state.cancel_requested:
            await self._cancelled(active)
            return False
        if state.status == AgentStatus.WAITING_FOR_APPROVAL:
            ahead = active.writer.joins_events
            settled = await self.approvals.settle(state, active.context, ahead=ahead)
            if settled is None:
                return False  # some call still has no decision
            await self._commit(active, settled)
        elif state.status != AgentStatus.RUNNING:
            self.lifecycle.move(state, AgentStatus.RUNNING)
            if state.error is not None and state.error.type in PAUSE_REASONS:
                state.error = None  # it paused for a rate limit or its lane: over now
            await self.lifecycle.flush()  # "running" before anything the run does
        if resumed:
            await self.coordination.resume_child(state)  # a delegated run: running again
        if active.new_input:
            await self._take_input(active)
        return True

    async def _steps(self, active: ActiveRun, cancel: asyncio.Event) -> None:
        state = active.state
        while state.status == AgentStatus.RUNNING:
            index = await self._look(active)
            if cancel.is_set() or index.cancel_requested:
                await self._cancelled(active)
                return
            state.absorb_child_usage(index.child_usage)
            active.stopwatch.tick(state)
            found = reached(state.limits)
            if found is not None:
                await stop_at_limit(state, self.lifecycle, active.writer, *found)
                return
            state.limits.iterations.step()
            await self._step(active)

    async def _look(self, active: ActiveRun) -> RunIndex:
        """The run's index (cancel requests, children's usage) and, when the step will
        look for others' appends, the session's head: both read at once (one round trip
        of waiting on a server, not two)."""
        index = self.runs.index(active.state.run_id)
        if active.writer.mode != "step":
            return (await index)[0]
        head = self.store.get_session(self.tenant, active.state.session_id)
        got_index, got_head = await asyncio.gather(index, head, return_exceptions=True)
        for failed in (got_index, got_head):
            if isinstance(failed, BaseException):
                raise failed
        assert not isinstance(got_index, BaseException)
        assert not isinstance(got_head, BaseException)
        active.looked = got_head
        return got_index[0]

    async def _end(self, active: ActiveRun) -> None:
        state = active.state
        await active.writer.flush(state, release=True)
        try:
            await report_usage(self.runs, state)
        except StatekeeperError as exc:  # the run itself is saved; say what went wrong
            payload = {"type": type(exc).__name__, "message": f"usage not reported: {exc}"}
            await self.lifecycle.publish(state, "error", "error", payload)
        if state.status in FINISHED:
            await self.lifecycle.publish(state, "lifecycle", "end", {"status": state.status})
            await self.coordination.settle_child(state)
        else:
            await self.lifecycle.settle(state)
            await self.coordination.pause_child(state)

    # -- one step ------------------------------------------------------------------------

    async def _step(self, active: ActiveRun) -> None:
        if active.trace is None:
            await self._take_step(active)
            return
        with active.trace.step(active.state):
            await self._take_step(active)

    async def _take_step(self, active: ActiveRun) -> None:
        state = active.state
        await self._foreign_messages(active)
        steering = self.coordination.steering(state.session_id)
        if steering:  # messages that arrived during the run steer it from this step
            active.new_input = steering
            await self._take_input(active)
        await self._auto_compact(active)
        action = await self._ask_agent(active)
        if action is None:
            return  # paused: rate limited on every profile
        await self._commit(active, await self._apply(active, action))

    async def _ask_agent(self, active: ActiveRun) -> Action | None:
        """The agent's action (accounted for); None when the run paused instead."""
        state = active.state
        span = state.trace.current_span
        state.turn += 1
        state.trace.spans += 1
        step_id = active.trace.step_id() if active.trace else None
        state.trace.current_span = step_id or f"{state.trace.trace_id}.s{state.trace.spans}"
        agent = find_agent(self.agents, state.agent)
        step_input = StepInput(
            state=state.copy_state(),
            messages=ReadOnlyMessages(active.messages),
            new_input=tuple(Message.model_validate(m) for m in state.pending_input),
            context=active.context,
            tools=self.tools.tools,
        )
        profiles = self.auth.get(state.agent) if isinstance(self.auth, Mapping) else self.auth
        started = time.time_ns()
        try:
            action, active.profile = await ask(agent, step_input, self.lifecycle, state, profiles)
        except StepPaused as paused:
            # Nothing of the step happened: it is taken again on resume.
            state.turn -= 1
            state.trace.spans -= 1
            state.trace.current_span = span
            state.limits.iterations.current = max(state.limits.iterations.current - 1, 0)
            await self._rate_limited(active, paused)
            return None
        state.pending_input = []
        account(state, action)
        if active.trace is not None and action.call is not None:
            active.trace.model_call(action.call, state.agent, started)
        return action

    async def _say(self, active: ActiveRun, action: Action, messages: list[Message]) -> None:
        """Publish what the agent said in this step (see `statekeeper.runs.step.said`):
        with the step's checkpoint, when the writer logs events with it."""
        state, hold = active.state, active.writer.joins_events
        for payload in said(action, messages, state.agent, active.profile):
            await self.lifecycle.publish(state, "assistant", "complete", payload, hold=hold)

    async def _apply(self, active: ActiveRun, action: Action) -> list[Message]:
        """Carry out ``action``; the messages the step writes."""
        state = active.state
        if isinstance(action, Respond):
            return await self._respond(active, action)
        if isinstance(action, Finish):
            self.guardrails.check_output(state, action.output)
            state.output = action.output
            messages = [action.message] if action.message else []
            await self._say(active, action, messages)
            self.lifecycle.move(state, AgentStatus.COMPLETED)
            return messages
        if isinstance(action, AskInput):
            messages = [Message.assistant(action.prompt, metadata={"fields": list(action.fields)})]
            await self._say(active, action, messages)
            self.lifecycle.move(state, AgentStatus.WAITING_FOR_INPUT)
            return messages
        if isinstance(action, Cancel):
            messages = [action.message] if action.message else []
            await self._say(active, action, messages)
            self.lifecycle.cancel(state, action.reason)
            return messages
        if isinstance(action, Handoff):
            find_agent(self.agents, action.to)
            marker = action.message or Message(
                role=Role.SYSTEM, content=f"[{state.agent} handed the conversation to {action.to}]"
            )
            await self._say(active, action, [marker])
            payload = {"status": state.status, "handoff": action.to}
            hold = active.writer.joins_events
            await self.lifecycle.publish(state, "lifecycle", "status", payload, hold=hold)
            state.agent = action.to
            return [marker]
        raise InvalidPayloadError(
            f"agent {state.agent} returned {type(action).__name__}; expected "
            "Respond, Finish, AskInput, Handoff or Cancel"
        )

    async def _respond(self, active: ActiveRun, action: Respond) -> list[Message]:
        state = active.state
        messages = list(action.messages)
        with_calls = [i for i, m in enumerate(messages) if m.tool_calls]
        if with_calls and with_calls != [len(messages) - 1]:
            raise InvalidPayloadError("put tool calls only in the last message of a Respond action")
        await self._say(active, action, messages)
        if not with_calls:
            return messages
        calls = messages[-1].tool_calls
        waiting = [c for c in calls if self.tools.needs_approval(state, c)]
        if not waiting:
            ahead = active.writer.joins_events
            return [*messages, *await self.tools.run(state, active.context, calls, ahead=ahead)]
        # The call message is held (not written) until every decision is in.
        await self.approvals.hold(state, messages[-1], waiting)
        return messages[:-1]

    # -- writing and stopping ------------------------------------------------------------

    async def _commit(self, active: ActiveRun, messages: list[Message]) -> None:
        active.stopwatch.tick(active.state)
        active.messages.extend(messages)
        active.added.extend(messages)
        await active.writer.save(active.state, messages)

    async def _take_input(self, active: ActiveRun) -> None:
        state = active.state
        self.guardrails.check_input(state, active.new_input)
        # Kept in the state until a step has seen it, so a pause in between loses nothing.
        state.pending_input = [*state.pending_input, *(m.to_dict() for m in active.new_input)]
        await self._commit(active, list(active.new_input))
        active.new_input = []

    async def _foreign_messages(self, active: ActiveRun) -> None:
        """Messages others appended to the session while the run went on steer it.

        This is how a message reaches a run in another process: append it to the
        session, and the run sees it as new input at its next step.
        """
        if active.writer.mode != "step":
            return  # the writer lags behind: other appends cannot be told from ours
        record, active.looked = active.looked, None
        if record is None:
            record = await self.store.get_session(self.tenant, active.state.session_id)
        own = active.writer.written
        if all(seq in own for seq in range(active.seen_seq + 1, record.last_seq + 1)):
            # Nothing but this run's own writes since it last looked: no read needed.
            active.seen_seq = max(active.seen_seq, record.last_seq)
            active.writer.written = {seq for seq in own if seq > active.seen_seq}
            return
        entries = await self.store.read_entries(
            self.tenant, active.state.session_id, after_seq=active.seen_seq
        )
        active.seen_seq = record.last_seq
        foreign = [message_of(e) for e in entries if e.kind == "message" and e.seq not in own]
        active.writer.written = {seq for seq in own if seq > active.seen_seq}
        if foreign:
            # The same input guardrails as for input given to the runner: appending to
            # the session directly must not be a way around them.
            self.guardrails.check_input(active.state, foreign)
            active.messages.extend(foreign)
            active.state.pending_input = [
                *active.state.pending_input,
                *(m.to_dict() for m in foreign),
            ]

    async def _auto_compact(self, active: ActiveRun) -> None:
        """Compact the session when the conversation is past the threshold (opt-in)."""
        auto = self.compaction
        if auto is None or not auto.due(active.messages, self.runs.counter):
            return
        await active.writer.flush(active.state)  # the session must hold what the agent sees
        session = await self.sessions.get(active.state.session_id)
        own, seen = active.writer.written, active.seen_seq
        compacted = await auto.apply(session, self.lifecycle, active.state, own=own, seen_seq=seen)
        if compacted is not None:
            active.messages = compacted

    async def _rate_limited(self, active: ActiveRun, paused: StepPaused) -> None:
        """Pause the run: its model call was refused on every auth profile."""
        state = active.state
        state.error = paused.details(state.turn)
        available = state.error.data["available_at"]
        self.lifecycle.move(
            state, AgentStatus.PAUSED, reason="rate_limited", available_at=available
        )
        await active.writer.save(state)
        await self.lifecycle.flush()

    async def _cancelled(self, active: ActiveRun, reason: str | None = None) -> None:
        self.lifecycle.cancel(active.state, reason or "cancel requested")
        await active.writer.save(active.state)
        payload = {"reason": reason or "cancelled"}
        await self.lifecycle.publish(active.state, "lifecycle", "abort", payload)

    async def _fail(self, active: ActiveRun, exc: BaseException) -> None:
        """End the run in ERROR with ``exc`` as its error details (best effort)."""
        state = active.state
        data: dict[str, Any] = {}
        if isinstance(exc, GuardrailTripped):
            data = {"guardrail": exc.result.name, "kind": exc.result.kind}
            exc.state = state
        state.error = ErrorDetails(
            type=type(exc).__name__, message=str(exc)[:2000], turn=state.turn, data=data
        )
        try:
            self.lifecycle.move(state, AgentStatus.ERROR)
            await active.writer.save(state)
            payload = {"type": type(exc).__name__, "message": str(exc)[:500], **data}
            await self.lifecycle.publish(state, "error", "error", payload)
        except StatekeeperError:
            pass  # the original error is what the caller needs to see
