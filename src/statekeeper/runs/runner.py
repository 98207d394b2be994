"""The runner: drives an agent step by step, checkpointing after every step.

A run stops when the agent finishes, asks for input, calls a tool that needs approval,
hits a limit, is cancelled, or fails; it can be resumed later, in this process or
another, from its last checkpoint. See ``docs/runs.md``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from pydantic import JsonValue

from statekeeper.codec import StateCodec
from statekeeper.core.lifecycle import DEFAULT_TRANSITIONS, AgentStatus, TransitionTable
from statekeeper.core.limits import Limits
from statekeeper.core.messages import Message, Role, ToolCallBlock, utcnow
from statekeeper.core.metrics import DelegationInfo
from statekeeper.core.tokens import TokenCounter
from statekeeper.errors import (
    InvalidInputError,
    InvalidPayloadError,
    InvalidTransitionError,
    LimitReachedError,
    NotFoundError,
    StatekeeperError,
)
from statekeeper.ids import new_id, validate_id
from statekeeper.runs.agent import (
    Action,
    Agent,
    AskInput,
    Cancel,
    Finish,
    Handoff,
    Respond,
    StepInput,
    Tool,
    ToolContext,
)
from statekeeper.runs.approvals import record_decision, settle
from statekeeper.runs.state import ErrorDetails, GuardrailResult, Interruption, RunState
from statekeeper.runs.store import RunStore
from statekeeper.runs.writer import CheckpointWriter, WriteMode
from statekeeper.runtime.events import EventBus
from statekeeper.runtime.followups import FollowupQueue
from statekeeper.runtime.lanes import CommandLanes
from statekeeper.runtime.subagents import SubagentFinishedError, SubagentRegistry
from statekeeper.sessions import SessionManager
from statekeeper.sessions.view import message_of
from statekeeper.stores.base import EventDraft, Store

__all__ = ["EventSink", "RunResult", "Runner"]

_FINISHED = (AgentStatus.COMPLETED, AgentStatus.CANCELLED, AgentStatus.ERROR)


class EventSink(Protocol):
    """Where the runner publishes run events (the event bus, or the store's event log)."""

    async def publish(
        self, run_id: str, stream: str, kind: str, payload: dict[str, Any]
    ) -> object: ...


class StoreEvents:
    """The default sink: append to the run's event log in the store."""

    def __init__(self, store: Store, tenant: str) -> None:
        self.store, self.tenant = store, tenant

    async def publish(self, run_id: str, stream: str, kind: str, payload: dict[str, Any]) -> object:
        draft = EventDraft(stream=stream, kind=kind, payload=payload)
        return await self.store.append_events(self.tenant, run_id, [draft])


@dataclass
class RunResult:
    """Where a run stopped: its state and the messages this call added."""

    state: RunState
    new_messages: list[Message] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        """The run's id (pass it to `Runner.resume`)."""
        return self.state.run_id

    @property
    def status(self) -> str:
        """The status the run stopped in."""
        return self.state.status

    @property
    def output(self) -> JsonValue:
        """The final output of a completed run."""
        return self.state.output

    @property
    def interruptions(self) -> list[Interruption]:
        """Tool calls waiting for a decision."""
        return list(self.state.interruptions)


@dataclass
class _Live:
    """What a driving runner holds besides the state: never persisted as is."""

    state: RunState
    writer: CheckpointWriter
    messages: list[Message]
    context: Any
    new_input: list[Message] = field(default_factory=list)
    added: list[Message] = field(default_factory=list)
    seen_seq: int = 0


class Runner:
    """Runs agents over sessions of one tenant, with checkpoints after every step."""

    def __init__(
        self,
        store: Store,
        tenant: str,
        agents: Iterable[Agent] | Mapping[str, Agent],
        tools: Iterable[Tool] = (),
        *,
        write_mode: WriteMode = "step",
        context_serializer: Callable[[Any], JsonValue] | None = None,
        context_deserializer: Callable[[JsonValue], Any] | None = None,
        input_guardrails: Sequence[Callable[[Sequence[Message]], GuardrailResult | None]] = (),
        output_guardrails: Sequence[Callable[[JsonValue], GuardrailResult | None]] = (),
        transitions: TransitionTable = DEFAULT_TRANSITIONS,
        events: EventSink | None = None,
        counter: TokenCounter | None = None,
        owner: str | None = None,
        lease_ttl: float = 300.0,
        lanes: CommandLanes | None = None,
        followups: FollowupQueue | None = None,
        codec: StateCodec | None = None,
        subagents: SubagentRegistry | None = None,
    ) -> None:
        self.store, self.tenant = store, tenant
        items = agents.values() if isinstance(agents, Mapping) else agents
        self.agents: dict[str, Agent] = {a.name: a for a in items}
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.write_mode: WriteMode = write_mode
        self.serialize = context_serializer
        self.deserialize = context_deserializer
        self.input_guardrails = list(input_guardrails)
        self.output_guardrails = list(output_guardrails)
        self.transitions = transitions
        self.events: EventSink = events if events is not None else EventBus(store, tenant)
        self.runs = RunStore(store, tenant, counter=counter, codec=codec)
        self.sessions = SessionManager(store, tenant, max_messages=None, counter=counter)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{new_id()[-6:]}"
        self.lease_ttl = lease_ttl
        self.lanes = lanes
        self.followups = followups
        self.subagents = subagents
        self._cancel: dict[str, asyncio.Event] = {}
        self._pending_status: list[tuple[str, str, str]] = []

    # -- public API ----------------------------------------------------------------------

    async def start(
        self,
        agent: str,
        input: str | Message | Sequence[Message] = (),
        *,
        session_id: str | None = None,
        title: str | None = None,
        headless: bool = True,
        limits: Limits | None = None,
        context: Any = None,
        group_id: str | None = None,
        run_id: str | None = None,
        metadata: dict[str, JsonValue] | None = None,
        delegation: DelegationInfo | None = None,
    ) -> RunResult:
        """Start a run of ``agent`` on a session (a new one unless ``session_id`` is given)."""
        self._agent(agent)
        if session_id is None:
            session_id = (await self.sessions.create(title=title, agent_id=agent)).id
        else:
            await self.sessions.get(session_id)
        state = RunState(
            run_id=validate_id(run_id, "run id") if run_id else new_id("run"),
            group_id=group_id,
            tenant=self.tenant,
            session_id=session_id,
            agent=agent,
            headless=headless,
            limits=limits or Limits(),
            context=self._serialize(context),
            metadata=metadata or {},
            delegation=delegation,
        )
        index_version = await self.runs.create(state)
        index_version = await self.runs.claim(state.run_id, self.owner, ttl=self.lease_ttl)
        live = await self._open(state, index_version, context)
        live.new_input = _as_messages(input)
        await self._publish(state, "lifecycle", "start", {"agent": agent, "headless": headless})
        return await self._in_lane(live)

    async def resume(
        self,
        run_id: str,
        input: str | Message | Sequence[Message] = (),
        *,
        context: Any = None,
        take_over: bool = False,
    ) -> RunResult:
        """Continue a stopped (or crashed) run from its last checkpoint.

        A run another live process holds raises `ConflictError`; ``take_over`` takes it
        anyway (when you know that process is gone, e.g. on another machine).
        """
        state, _, _ = await self.runs.load(run_id)
        state.validate_for_resume(has_deserializer=self.deserialize is not None)
        new_input = _as_messages(input)
        if state.status == AgentStatus.WAITING_FOR_INPUT and not new_input:
            raise InvalidInputError(f"run {run_id} is waiting for input; pass input= to resume")
        index_version = await self.runs.claim(
            run_id, self.owner, ttl=self.lease_ttl, take_over=take_over
        )
        try:
            live = await self._open(state, index_version, context)
        except BaseException:
            await self.runs.release(state, owner=self.owner, checkpoint_seq=None)
            raise
        live.new_input = new_input
        return await self._in_lane(live)

    async def approve(
        self,
        run_id: str,
        call_id: str,
        *,
        always: bool = False,
        reason: str | None = None,
        by: str | None = None,
    ) -> RunState:
        """Approve a pending tool call (``always``: every later call of that tool too)."""
        return await self._decide(run_id, call_id, True, always, reason, by)

    async def reject(
        self,
        run_id: str,
        call_id: str,
        *,
        always: bool = False,
        reason: str | None = None,
        by: str | None = None,
    ) -> RunState:
        """Reject a pending tool call; the agent sees the rejection as the call's result."""
        return await self._decide(run_id, call_id, False, always, reason, by)

    async def cancel(self, run_id: str, reason: str | None = None) -> RunState:
        """Cancel a run: a running one stops before its next step, a stopped one at once."""
        index = await self.runs.request_cancel(run_id)
        if run_id in self._cancel:
            self._cancel[run_id].set()
        state, index_version, session_version = await self.runs.load(run_id)
        if (
            index.owner not in (None, self.owner)
            and index.lease_until
            and index.lease_until > utcnow()
        ):
            return state  # its owner will see the flag at its next step
        if run_id in self._cancel or state.status in _FINISHED:
            return state
        self._cancel_now(state, reason)
        saved = await self.runs.save(
            state, index_version=index_version, session_version=session_version
        )
        await self._publish(state, "lifecycle", "abort", {"reason": reason or "cancelled"})
        return saved.state

    async def raise_limits(self, run_id: str) -> RunState:
        """Raise every reached limit by its increase amount (interactive runs only)."""
        state, index_version, session_version = await self.runs.load(run_id)
        if not state.limits.increase_limits(headless=state.headless):
            raise InvalidInputError(
                f"run {run_id} has no reached limit that can be raised "
                "(headless runs and increase_amount=0 never raise)"
            )
        saved = await self.runs.save(
            state, index_version=index_version, session_version=session_version
        )
        return saved.state

    async def load(self, run_id: str) -> RunState:
        """The run's latest checkpoint."""
        return (await self.runs.load(run_id))[0]

    async def delegate(
        self,
        parent: RunState,
        agent: str,
        input: str | Message | Sequence[Message],
        *,
        own_session: bool = True,
        headless: bool | None = None,
        limits: Limits | None = None,
        task: str | None = None,
    ) -> RunResult:
        """Run ``agent`` as a child of ``parent`` (delegate level + 1, metrics snapshot).

        With a subagent registry the child is registered first and settled when it ends.
        """
        delegation = DelegationInfo.child_of(
            parent.delegation or 0,
            parent.metrics,
            int(parent.limits.iterations.current),
            parent_run_id=parent.run_id,
        )
        run_id = new_id("run")
        session_id = parent.session_id
        if own_session:
            title = f"delegated by {parent.run_id}"
            session_id = (await self.sessions.create(title=title, agent_id=agent)).id
        if self.subagents is not None:
            messages = _as_messages(input)
            await self.subagents.register(
                run_id,
                child_session_id=session_id,
                requester_session_id=parent.session_id,
                task=task or (messages[0].text if messages else agent),
            )
        return await self.start(
            agent,
            input,
            session_id=session_id,
            run_id=run_id,
            headless=parent.headless if headless is None else headless,
            limits=limits,
            group_id=parent.group_id or parent.run_id,
            delegation=delegation,
            context=self._deserialize(parent.context),
        )

    # -- the loop ------------------------------------------------------------------------

    async def _open(self, state: RunState, index_version: int, context: Any) -> _Live:
        if context is None and state.context is not None:
            context = self._deserialize(state.context)
        session = await self.sessions.get(state.session_id)
        writer = CheckpointWriter(
            self.runs,
            self.write_mode,
            revision=state.revision,
            index_version=index_version,
            owner=self.owner,
            lease_ttl=self.lease_ttl,
        )
        live = _Live(state, writer, await session.messages(), context)
        live.seen_seq = session.record.last_seq
        return live

    async def _in_lane(self, live: _Live) -> RunResult:
        """Drive the run in its session's lane (one run per session at a time)."""
        if self.lanes is None:
            return await self._drive(live)
        lane = f"session:{live.state.session_id}"
        return await self.lanes.run(lane, lambda: self._drive(live))

    async def _drive(self, live: _Live) -> RunResult:
        if self.followups is None:
            return await self._drive_loop(live)
        with self.followups.active(live.state.session_id, live.state.run_id):
            return await self._drive_loop(live)

    async def _drive_loop(self, live: _Live) -> RunResult:
        state = live.state
        self._cancel[state.run_id] = cancel = asyncio.Event()
        try:
            if state.cancel_requested:
                self._cancel_now(state, "cancel requested")
                await live.writer.save(state)
                await self._publish(state, "lifecycle", "abort", {"reason": "cancelled"})
                return RunResult(state, live.added)
            if state.status == AgentStatus.WAITING_FOR_APPROVAL:
                if not await self._settle_approvals(live):
                    return RunResult(state, live.added)
            elif state.status != AgentStatus.RUNNING:
                self._move(state, AgentStatus.RUNNING)
            if live.new_input:
                await self._check_input(live)
            while state.status == AgentStatus.RUNNING:
                if cancel.is_set() or (await self.runs.index(state.run_id))[0].cancel_requested:
                    self._cancel_now(state, "cancel requested")
                    await live.writer.save(state)
                    await self._publish(state, "lifecycle", "abort", {"reason": "cancelled"})
                    break
                try:
                    state.limits.iterations.step()
                except LimitReachedError as exc:
                    await self._limit(live, exc)
                    break
                await self._step(live)
            return RunResult(state, live.added)
        except BaseException as exc:
            if not isinstance(exc, (LimitReachedError, asyncio.CancelledError)) and (
                state.status not in _FINISHED
            ):
                await self._fail(live, exc)
            raise
        finally:
            self._cancel.pop(state.run_id, None)
            await live.writer.flush(state, release=True)
            if state.status in _FINISHED:
                await self._publish(state, "lifecycle", "end", {"status": state.status})
                await self._settle_subagent(state)
            else:
                await self._flush_status()

    async def _foreign_messages(self, live: _Live) -> None:
        """Messages others appended to the session while the run went on steer it.

        This is how a message reaches a run in another process: append it to the
        session, and the run sees it as new input at its next step.
        """
        if live.writer.mode != "step":
            return  # the writer lags behind: other appends cannot be told from ours
        record = await self.store.get_session(self.tenant, live.state.session_id)
        if record.last_seq <= live.seen_seq:
            return
        entries = await self.store.read_entries(
            self.tenant, live.state.session_id, after_seq=live.seen_seq
        )
        live.seen_seq = record.last_seq
        own = live.writer.written
        foreign = [message_of(e) for e in entries if e.kind == "message" and e.seq not in own]
        live.writer.written = {seq for seq in own if seq > live.seen_seq}
        if foreign:
            live.messages.extend(foreign)
            live.state.pending_input = [
                *live.state.pending_input,
                *(m.to_dict() for m in foreign),
            ]

    async def _step(self, live: _Live) -> None:
        state = live.state
        await self._foreign_messages(live)
        if self.followups is not None:
            steering = self.followups.take_steering(state.session_id)
            if steering:  # messages that arrived during the run steer it from this step
                live.new_input = list(steering)
                await self._check_input(live)
        state.turn += 1
        state.trace.spans += 1
        state.trace.current_span = f"{state.trace.trace_id}.s{state.trace.spans}"
        agent = self._agent(state.agent)
        step_input = StepInput(
            state=state.copy_state(),
            messages=_ReadOnly(live.messages),
            new_input=tuple(Message.model_validate(m) for m in state.pending_input),
            context=live.context,
            tools=self.tools,
        )
        state.pending_input = []
        action = await agent.step(step_input)
        self._account(state, action)
        if action.call is not None:
            await self._publish(
                state,
                "assistant",
                "complete",
                {
                    "text": "",
                    "model": action.call.model,
                    "usage": action.call.usage.model_dump(mode="json"),
                    "cost": action.call.cost,
                    "agent": state.agent,
                },
            )
        written: list[Message] = []
        if isinstance(action, Respond):
            written = await self._respond(live, action)
        elif isinstance(action, Finish):
            self._check_output(state, action.output)
            state.output = action.output
            written = [action.message] if action.message else []
            self._move(state, AgentStatus.COMPLETED)
        elif isinstance(action, AskInput):
            written = [Message.assistant(action.prompt, metadata={"fields": list(action.fields)})]
            self._move(state, AgentStatus.WAITING_FOR_INPUT)
        elif isinstance(action, Cancel):
            written = [action.message] if action.message else []
            self._cancel_now(state, action.reason)
        elif isinstance(action, Handoff):
            self._agent(action.to)
            marker = action.message or Message(
                role=Role.SYSTEM, content=f"[{state.agent} handed the conversation to {action.to}]"
            )
            written = [marker]
            await self._publish(
                state, "lifecycle", "status", {"status": state.status, "handoff": action.to}
            )
            state.agent = action.to
        else:
            raise InvalidPayloadError(
                f"agent {state.agent} returned {type(action).__name__}; expected "
                "Respond, Finish, AskInput, Handoff or Cancel"
            )
        await self._commit(live, written)
        try:
            for flag in (state.limits.budget, state.limits.tokens):
                if flag is not None:
                    flag.check()
        except LimitReachedError as exc:
            await self._limit(live, exc)

    async def _respond(self, live: _Live, action: Respond) -> list[Message]:
        state = live.state
        messages = list(action.messages)
        with_calls = [i for i, m in enumerate(messages) if m.tool_calls]
        if not with_calls:
            return messages
        if with_calls != [len(messages) - 1]:
            raise InvalidPayloadError("put tool calls only in the last message of a Respond action")
        call_message = messages[-1]
        calls = call_message.tool_calls
        waiting = [c for c in calls if self._needs_approval(state, c)]
        if not waiting:
            return [*messages, *await self._run_tools(live, calls)]
        # Hold the call message until every decision is in: it is written together with
        # the results, so the transcript never has a call without its result.
        state.interruptions = [
            Interruption(
                call_id=c.id,
                tool=c.name,
                arguments=c.arguments,
                agent=state.agent,
                message=call_message.to_dict(),
                prompt=self.tools[c.name].approval_prompt if c.name in self.tools else None,
            )
            for c in calls
        ]
        for call in calls:
            if call not in waiting:
                record_decision(state, call.id, approved=True, decided_by="policy")
        self._move(state, AgentStatus.WAITING_FOR_APPROVAL)
        for call in waiting:
            await self._publish(
                state,
                "tool",
                "call_start",
                {"tool": call.name, "call_id": call.id, "awaiting_approval": True},
            )
        return messages[:-1]

    async def _settle_approvals(self, live: _Live) -> bool:
        """Apply decisions; False if some call still waits for one."""
        state = live.state
        settled = settle(state)
        if settled.pending:
            return False
        message = Message.model_validate(state.interruptions[0].message)
        approved = {c.call_id for c in settled.approved}
        calls = [c for c in message.tool_calls if c.id in approved]
        results = {r.tool_results[0].tool_call_id: r for r in await self._run_tools(live, calls)}
        for call, reason in settled.rejected:
            state.tool_use[call.tool] = state.tool_use.get(call.tool, 0)
            results[call.call_id] = Message.tool_result(
                call.call_id, f"Tool call rejected: {reason}", is_error=True
            )
            await self._publish(
                state,
                "tool",
                "error",
                {"tool": call.tool, "call_id": call.call_id, "rejected": reason},
            )
        ordered = [results[c.id] for c in message.tool_calls]
        handled = {i.call_id for i in state.interruptions}
        state.interruptions = []
        state.decisions = [d for d in state.decisions if d.call_id not in handled]
        self._move(state, AgentStatus.RUNNING)
        await self._commit(live, [message, *ordered])
        return True

    async def _run_tools(self, live: _Live, calls: Sequence[ToolCallBlock]) -> list[Message]:
        state = live.state
        out: list[Message] = []
        for call in calls:
            state.tool_use[call.name] = state.tool_use.get(call.name, 0) + 1
            text, is_error = await self._call_tool(live, call)
            out.append(Message.tool_result(call.id, text, is_error=is_error))
        return out

    async def _call_tool(self, live: _Live, call: ToolCallBlock) -> tuple[str, bool]:
        state = live.state
        tool = self.tools.get(call.name)
        info = {"call_id": call.id, "tool": call.name, "span": state.trace.current_span}
        await self._publish(state, "tool", "call_start", info)
        if tool is None:
            await self._publish(state, "tool", "error", {**info, "error": "unknown tool"})
            return f"error: no tool named {call.name!r}", True
        try:
            arguments = json.loads(call.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            await self._publish(state, "tool", "error", {**info, "error": str(exc)})
            return f"error: invalid arguments: {exc}", True
        for check, value, kind in ((tool.input_guardrail, arguments, "tool_input"),):
            blocked = self._guard(state, check, value, kind)
            if blocked:
                return blocked, True
        try:
            result = await tool.fn(arguments, ToolContext(state, call.id, live.context))
        except Exception as exc:
            await self._publish(state, "tool", "error", {**info, "error": repr(exc)})
            return f"error: {type(exc).__name__}: {exc}", True
        blocked = self._guard(state, tool.output_guardrail, result, "tool_output")
        if blocked:
            return blocked, True
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        await self._publish(state, "tool", "result", {**info, "output": text[:2000]})
        return text, False

    def _guard(self, state: RunState, check: Any, value: Any, kind: str) -> str | None:
        if check is None:
            return None
        result: GuardrailResult | None = check(value)
        if result is None:
            return None
        result = result.model_copy(update={"kind": kind, "turn": state.turn})
        state.guardrails = [*state.guardrails, result]
        return f"blocked by guardrail {result.name}" if result.triggered else None

    async def _check_input(self, live: _Live) -> None:
        state = live.state
        for check in self.input_guardrails:
            result = check(live.new_input)
            if result is not None:
                result = result.model_copy(update={"kind": "input", "turn": state.turn})
                state.guardrails = [*state.guardrails, result]
                if result.triggered:
                    raise _GuardrailTripped(f"input guardrail {result.name} triggered")
        # Kept in the state until a step has seen it, so a pause in between loses nothing.
        live.state.pending_input = [
            *live.state.pending_input,
            *(m.to_dict() for m in live.new_input),
        ]
        await self._commit(live, list(live.new_input))
        live.new_input = []

    def _check_output(self, state: RunState, output: JsonValue) -> None:
        for check in self.output_guardrails:
            result = check(output)
            if result is not None:
                result = result.model_copy(update={"kind": "output", "turn": state.turn})
                state.guardrails = [*state.guardrails, result]
                if result.triggered:
                    raise _GuardrailTripped(f"output guardrail {result.name} triggered")

    # -- helpers -------------------------------------------------------------------------

    async def _commit(self, live: _Live, messages: list[Message]) -> None:
        live.messages.extend(messages)
        live.added.extend(messages)
        await live.writer.save(live.state, messages)
        for message in messages:
            if message.role == Role.ASSISTANT:
                await self._publish(
                    live.state,
                    "assistant",
                    "complete",
                    {"id": message.id, "text": message.text[:2000]},
                )

    def _account(self, state: RunState, action: Action) -> None:
        if action.call is not None:
            call = action.call
            state.metrics.add(call.model, cost=call.cost, usage=call.usage, latency=call.latency)
            if state.limits.budget is not None:
                state.limits.budget.set_current(state.metrics.accumulated_cost)
            if state.limits.tokens is not None:
                state.limits.tokens.set_current(state.metrics.usage.total)
        if action.metadata:
            state.metadata = {**state.metadata, **action.metadata}
        if action.guardrails:
            state.guardrails = [
                *state.guardrails,
                *(g.model_copy(update={"turn": state.turn}) for g in action.guardrails),
            ]

    def _needs_approval(self, state: RunState, call: ToolCallBlock) -> bool:
        tool = self.tools.get(call.name)
        if tool is None or state.always.get(call.name) is True:
            return False
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return False  # the call fails on its bad arguments without running
        return tool.needs_approval(arguments if isinstance(arguments, dict) else {})

    async def _limit(self, live: _Live, exc: LimitReachedError) -> None:
        state = live.state
        if state.headless:
            state.error = ErrorDetails(
                type="LimitReachedError",
                message=str(exc),
                turn=state.turn,
                data={"limit": exc.name, "current": exc.current, "maximum": exc.maximum},
            )
            self._move(state, AgentStatus.ERROR)
            await live.writer.save(state)
            await self._publish(state, "error", "error", {"message": str(exc), "type": "limit"})
            raise LimitReachedError(exc.name, exc.current, exc.maximum, state=state) from exc
        self._move(state, AgentStatus.PAUSED)
        await live.writer.save(state)
        await self._publish(
            state, "lifecycle", "status", {"status": state.status, "limit": str(exc)}
        )

    async def _fail(self, live: _Live, exc: BaseException) -> None:
        state = live.state
        state.error = ErrorDetails(
            type=type(exc).__name__, message=str(exc)[:2000], turn=state.turn
        )
        try:
            self._move(state, AgentStatus.ERROR)
            await live.writer.save(state)
            await self._publish(
                state, "error", "error", {"type": type(exc).__name__, "message": str(exc)[:500]}
            )
        except StatekeeperError:
            pass  # the original error is what the caller needs to see

    def _cancel_now(self, state: RunState, reason: str | None) -> None:
        if not self.transitions.allows(state.status, AgentStatus.CANCELLED):
            self._move(state, AgentStatus.PAUSED)
        self._move(state, AgentStatus.CANCELLED)
        state.cancel_requested = True
        state.metadata = {**state.metadata, "cancel_reason": reason or "cancelled"}

    def _move(self, state: RunState, target: str) -> None:
        if not self.transitions.allows(state.status, target):
            raise InvalidTransitionError(
                state.status, target, self.transitions.allowed(state.status)
            )
        source, state.status = state.status, target
        self._pending_status.append((state.run_id, source, target))

    async def _decide(
        self,
        run_id: str,
        call_id: str,
        approved: bool,
        always: bool,
        reason: str | None,
        by: str | None,
    ) -> RunState:
        state, index_version, session_version = await self.runs.load(run_id)
        if state.status != AgentStatus.WAITING_FOR_APPROVAL:
            raise InvalidInputError(f"run {run_id} is {state.status}, not waiting for approval")
        record_decision(
            state, call_id, approved=approved, always=always, reason=reason, decided_by=by
        )
        saved = await self.runs.save(
            state, index_version=index_version, session_version=session_version
        )
        return saved.state

    async def _settle_subagent(self, state: RunState) -> None:
        """Mark a delegated run's registry entry completed or failed."""
        if self.subagents is None or state.delegation is None:
            return
        try:
            if state.status == AgentStatus.COMPLETED:
                outcome = (
                    state.output if isinstance(state.output, str) else json.dumps(state.output)
                )
                await self.subagents.complete(state.run_id, outcome)
            else:
                reason = state.error.message if state.error else str(state.status)
                await self.subagents.fail(state.run_id, reason)
        except (NotFoundError, SubagentFinishedError):
            pass  # not registered here, or already settled (killed, say)

    async def _flush_status(self) -> None:
        pending, self._pending_status = self._pending_status, []
        for run_id, source, target in pending:
            await self.events.publish(
                run_id, "lifecycle", "status", {"status": target, "from": source, "to": target}
            )

    async def _publish(
        self, state: RunState, stream: str, kind: str, payload: dict[str, Any]
    ) -> None:
        await self._flush_status()
        payload = {**payload, "trace_id": state.trace.trace_id, "turn": state.turn}
        await self.events.publish(state.run_id, stream, kind, payload)

    def _agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            raise InvalidInputError(
                f"no agent named {name!r}; known: {', '.join(sorted(self.agents)) or 'none'}"
            ) from None

    def _serialize(self, context: Any) -> JsonValue:
        if context is None:
            return None
        if self.serialize is None:
            raise InvalidInputError("a run context needs a context_serializer on the Runner")
        return self.serialize(context)

    def _deserialize(self, data: JsonValue) -> Any:
        if data is None:
            return None
        if self.deserialize is None:
            raise InvalidInputError(
                "this run has a stored context; give the Runner a context_deserializer"
            )
        try:
            return self.deserialize(data)
        except Exception as exc:
            raise InvalidPayloadError(f"the run's context cannot be deserialized: {exc}") from exc


class _GuardrailTripped(StatekeeperError):
    """An input or output guardrail stopped the run."""


class _ReadOnly(Sequence[Message]):
    """A read-only view of the run's message list: O(1) to hand to an agent each step."""

    __slots__ = ("_items",)

    def __init__(self, items: list[Message]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self._items[index]


def _as_messages(value: str | Message | Sequence[Message]) -> list[Message]:
    if isinstance(value, str):
        return [Message.user(value)]
    if isinstance(value, Message):
        return [value]
    return list(value)
