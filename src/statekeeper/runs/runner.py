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
from typing import Any

from pydantic import JsonValue

from statekeeper.codec import StateCodec
from statekeeper.core.lifecycle import DEFAULT_TRANSITIONS, AgentStatus, TransitionTable
from statekeeper.core.limits import Limits
from statekeeper.core.messages import Message, Role, utcnow
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
)
from statekeeper.runs.approvals import record_decision
from statekeeper.runs.results import (
    EventSink,
    ReadOnlyMessages,
    RunResult,
    SessionLocks,
    as_messages,
)
from statekeeper.runs.state import ErrorDetails, GuardrailResult, RunState
from statekeeper.runs.store import RunStore
from statekeeper.runs.tooling import Live as _Live
from statekeeper.runs.tooling import ToolSteps
from statekeeper.runs.writer import CheckpointWriter, WriteMode
from statekeeper.runtime.events import EventBus
from statekeeper.runtime.followups import FollowupQueue
from statekeeper.runtime.lanes import CommandLanes
from statekeeper.runtime.subagents import SubagentFinishedError, SubagentRegistry
from statekeeper.sessions import SessionManager
from statekeeper.sessions.view import message_of
from statekeeper.stores.base import Store

__all__ = ["EventSink", "RunResult", "Runner"]

_FINISHED = (AgentStatus.COMPLETED, AgentStatus.CANCELLED, AgentStatus.ERROR)


class Runner(ToolSteps):
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
        session_locks: SessionLocks | None = None,
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
        self.session_locks = session_locks
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
        live.new_input = as_messages(input)
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
        new_input = as_messages(input)
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
            messages = as_messages(input)
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
        """Drive the run in its session's lane (one run per session at a time): the
        in-process lane first, then the cross-process session lock, if configured."""
        if self.lanes is None:
            return await self._locked(live)
        lane = f"session:{live.state.session_id}"
        return await self.lanes.run(lane, lambda: self._locked(live))

    async def _locked(self, live: _Live) -> RunResult:
        if self.session_locks is None:
            return await self._drive(live)
        async with self.session_locks.hold(self.tenant, live.state.session_id):
            return await self._drive(live)

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
            messages=ReadOnlyMessages(live.messages),
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
