"""The runner: starts, resumes, decides and cancels runs of agents over sessions.

A run stops when the agent finishes, asks for input, calls a tool that needs approval,
hits a limit, is cancelled, or fails; it can be resumed later, in this process or
another, from its last checkpoint. See ``docs/runs.md``.

`Runner` is a small composition: option groups (`CheckpointOptions`, `Coordination`,
`Guardrails`, `ContextCodec`, `RunPolicy`) configure collaborators it holds — the
`ToolBox` (tool calls), the `ApprovalGate` (approvals), the `RunLifecycle` (status moves
and events) and the `RunLoop` (the steps) — over a `RunStore` and a `SessionManager`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Unpack

from pydantic import JsonValue

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.limits import Limits
from statekeeper.core.messages import Message, utcnow
from statekeeper.core.metrics import DelegationInfo
from statekeeper.errors import (
    InvalidIdError,
    InvalidInputError,
    LimitReachedError,
    NotFoundError,
    StatekeeperError,
)
from statekeeper.ids import new_id, validate_id
from statekeeper.runs.agent import Agent, Tool
from statekeeper.runs.compaction import AutoCompaction, compact_published
from statekeeper.runs.coordination import Coordination
from statekeeper.runs.delegation import start_child
from statekeeper.runs.gate import ApprovalGate
from statekeeper.runs.guardrails import Guardrails
from statekeeper.runs.lifecycle import FINISHED, RunLifecycle
from statekeeper.runs.limiting import check_room, reached
from statekeeper.runs.limiting import raise_limits as raise_run_limits
from statekeeper.runs.loop import ActiveRun, RunLoop, find_agent
from statekeeper.runs.options import (
    CheckpointOptions,
    ContextCodec,
    FlatOptions,
    RunPolicy,
    apply_flat,
)
from statekeeper.runs.results import EventSink, RunResult, as_messages
from statekeeper.runs.rollup import settle_children
from statekeeper.runs.spans import RunTrace, drive_span
from statekeeper.runs.state import RunState
from statekeeper.runs.stats import SessionStats, session_stats
from statekeeper.runs.store import RunStore, check_not_held
from statekeeper.runs.tools import ToolBox
from statekeeper.runs.writer import CheckpointWriter
from statekeeper.runtime.events import EventBus
from statekeeper.runtime.profiles import AuthProfiles
from statekeeper.runtime.subagents import SubagentRegistry
from statekeeper.sessions import CompactionResult, SessionManager, Summarizer
from statekeeper.stores.base import Store
from statekeeper.tracing import traced

__all__ = ["EventSink", "RunResult", "Runner"]


_DECIDING = (AgentStatus.WAITING_FOR_APPROVAL, AgentStatus.WAITING_FOR_INPUT)
"""Statuses whose pending step finishes before the limits are checked again."""

MAX_RUN_ID_LENGTH = 100
"""The longest run id a new run takes: the ids derived from it (its checkpoints'
``<run id>.c<revision>``) must stay within `statekeeper.ids.MAX_ID_LENGTH`."""


def check_new_run_id(run_id: object) -> str:
    """``run_id`` if it is a valid id short enough for the ids derived from it, else
    `InvalidIdError` naming the limit (checked before anything is written)."""
    checked = validate_id(run_id, "run id")
    if len(checked) > MAX_RUN_ID_LENGTH:
        raise InvalidIdError(
            f"run id is {len(checked)} characters long; the limit for a new run is "
            f"{MAX_RUN_ID_LENGTH} (its checkpoints' ids add to it)"
        )
    return checked


class Runner:
    """Runs agents over sessions of one tenant, with checkpoints after every step.

    Args:
        store, tenant: where runs and sessions live, and whose they are.
        agents: the agents, by their ``name``.
        tools: the tools agents may call.
        checkpoints: write mode, checkpoint codec, token counter.
        coordination: event sink, lanes, session locks, follow-ups, subagent registry,
            lease owner and ttl.
        guardrails: input and output guardrails of every run.
        context_codec: how the user context is stored in the run state.
        policy: the status transition table and default limits.
        compaction: compact a run's session automatically past a token threshold.
        auth: the auth profiles agents take for their model calls (`StepInput.auth_profile`),
            rotated on `RateLimited`: one `AuthProfiles` for every agent, or a mapping
            of agent name to profiles.
        **flat: the flat keywords of earlier versions (`FlatOptions`), e.g.
            ``write_mode=``, ``lanes=``: each sets the field of its group.
    """

    def __init__(
        self,
        store: Store,
        tenant: str,
        agents: Iterable[Agent] | Mapping[str, Agent],
        tools: Iterable[Tool] = (),
        *,
        checkpoints: CheckpointOptions | None = None,
        coordination: Coordination | None = None,
        guardrails: Guardrails | None = None,
        context_codec: ContextCodec | None = None,
        policy: RunPolicy | None = None,
        compaction: AutoCompaction | None = None,
        auth: AuthProfiles | Mapping[str, AuthProfiles] | None = None,
        **flat: Unpack[FlatOptions],
    ) -> None:
        # Store spans only when a tracer provider is configured now: none costs nothing.
        store = traced(store)
        self.store, self.tenant = store, tenant
        self.checkpoints = apply_flat("checkpoints", checkpoints or CheckpointOptions(), flat)
        self.coordination = apply_flat("coordination", coordination or Coordination(), flat)
        if self.coordination.subagents is None:
            # Delegated runs are listed (`statekeeper subagents list`) without asking.
            registry = SubagentRegistry(store, tenant, owner_id=self.coordination.owner)
            self.coordination = replace(self.coordination, subagents=registry)
        self.guardrails = apply_flat("guardrails", guardrails or Guardrails(), flat)
        self.context_codec = apply_flat("context_codec", context_codec or ContextCodec(), flat)
        self.policy = apply_flat("policy", policy or RunPolicy(), flat)
        items = agents.values() if isinstance(agents, Mapping) else agents
        self.agents: dict[str, Agent] = {a.name: a for a in items}
        counter, codec = self.checkpoints.counter, self.checkpoints.codec
        self.runs = RunStore(store, tenant, counter=counter, codec=codec)
        self.sessions = SessionManager(store, tenant, max_messages=None, counter=counter)
        events = self.coordination.events
        self.lifecycle = RunLifecycle(
            self.policy.transitions, events if events is not None else EventBus(store, tenant)
        )
        self.tools = ToolBox(tools, self.lifecycle)
        self.approvals = ApprovalGate(self.runs, self.tools, self.lifecycle)
        self.loop = RunLoop(
            store=store,
            tenant=tenant,
            runs=self.runs,
            agents=self.agents,
            tools=self.tools,
            approvals=self.approvals,
            guardrails=self.guardrails,
            lifecycle=self.lifecycle,
            coordination=self.coordination,
            sessions=self.sessions,
            compaction=compaction,
            auth=auth,
            clock=self.policy.clock,
        )

    @property
    def owner(self) -> str:
        """This runner's lease owner id (``host:pid:...`` unless configured)."""
        return self.coordination.owner

    @property
    def events(self) -> EventSink:
        """Where this runner publishes run events."""
        return self.lifecycle.events

    # -- starting and resuming -----------------------------------------------------------

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
        """Start a run of ``agent`` on a session (a new one unless ``session_id`` is given).

        ``limits`` default to the policy's. At a limit a run pauses; a ``headless`` one
        also raises `LimitReachedError` (with the state), so its caller can raise the
        limit and resume. ``context`` is the live user context (stored through the
        context codec). A ``delegation`` (see `delegate`) makes the run a child: its
        metrics start from the parent's snapshot.
        """
        find_agent(self.agents, agent)
        run_id = check_new_run_id(run_id) if run_id is not None else new_id("run")
        with drive_span(agent=agent, run_id=run_id, trace=None) as trace:
            created = session_id is None
            if session_id is None:
                session_id = (await self.sessions.create(title=title, agent_id=agent)).id
            else:
                await self.sessions.get(session_id)
            try:
                state = RunState(
                    run_id=run_id,
                    group_id=group_id,
                    tenant=self.tenant,
                    session_id=session_id,
                    agent=agent,
                    headless=headless,
                    limits=self.policy.limits_for(limits),
                    context=self.context_codec.dump(context),
                    metadata=metadata or {},
                    delegation=delegation,
                )
                if delegation is not None:  # the total so far: local = total - snapshot
                    state.metrics = delegation.parent_metrics_snapshot.snapshot()
                await self.runs.create(state, owner=self.owner, ttl=self.coordination.lease_ttl)
            except BaseException:
                if created:  # a run that could not be registered leaves no session behind
                    with contextlib.suppress(StatekeeperError):
                        await self.sessions.delete(session_id)
                raise
            lease = self.coordination.lease_ttl
            index_version = await self.runs.claim(state.run_id, self.owner, ttl=lease)
            active = await self._open(state, index_version, context, trace)
            active.new_input = as_messages(input)
            payload = {"agent": agent, "headless": headless}
            await self.lifecycle.publish(state, "lifecycle", "start", payload)
            return await self.loop.drive(active)

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
        anyway (when you know that process is gone, e.g. on another machine). A run at a
        limit raises `LimitReachedError` and stays as it is: `raise_limits` first.
        """
        await settle_children(self.runs, run_id, self.coordination.track_child)  # crashed ones
        state, _, _ = await self.runs.load(run_id)
        state.validate_for_resume(has_deserializer=self.context_codec.deserializer is not None)
        if state.status not in _DECIDING:
            check_room(state)  # those two finish their step first; the loop checks after
        new_input = as_messages(input)
        if state.status == AgentStatus.WAITING_FOR_INPUT and not new_input:
            raise InvalidInputError(f"run {run_id} is waiting for input; pass input= to resume")
        lease = self.coordination.lease_ttl
        with drive_span(agent=state.agent, run_id=run_id, trace=state.trace) as trace:
            index_version = await self.runs.claim(
                run_id, self.owner, ttl=lease, take_over=take_over
            )
            try:
                active = await self._open(state, index_version, context, trace)
            except BaseException:
                await self.runs.release(state, owner=self.owner, checkpoint_seq=None)
                raise
            active.new_input = new_input
            return await self.loop.drive(active)

    async def create_fork(
        self,
        run_id: str,
        *,
        at: int | None = None,
        state_update: Mapping[str, Any] | None = None,
        new_run_id: str | None = None,
        title: str | None = None,
    ) -> RunState:
        """`RunStore.fork` for a fork that is to run at once: refused with
        `LimitReachedError`, leaving nothing behind, when the new run has no room under
        its limits to take a step (`fork` and the server's ``fork`` with ``run`` use it)."""
        state = await self.runs.fork(
            run_id, at=at, state_update=state_update, new_run_id=new_run_id, title=title
        )
        found = None if state.status in _DECIDING else reached(state.limits)
        if found is not None:
            # Refused before it ran: the new run and its session go, leaving no orphan.
            await self.runs.delete(state.run_id)
            with contextlib.suppress(NotFoundError):
                await self.sessions.delete(state.session_id)
            _, flag = found
            hint = (
                f"the fork of run {run_id} has no room under its limits, so it was not "
                f"created; fork with more room, e.g. state_update={{'limits': ...}}, or "
                f"fork at an earlier step"
            )
            raise LimitReachedError(flag.name, flag.current, flag.maximum or 0.0, hint=hint)
        return state

    async def fork(
        self,
        run_id: str,
        *,
        at: int | None = None,
        input: str | Message | Sequence[Message] = (),
        state_update: Mapping[str, Any] | None = None,
        context: Any = None,
        new_run_id: str | None = None,
        title: str | None = None,
    ) -> RunResult:
        """Replay a run from a past checkpoint as a new run, and drive it until it stops.

        ``at`` is a ``step`` of ``runner.runs.history(run_id)`` (None: the newest one that
        is not finished). The new run gets a session forked at that checkpoint (nothing
        copied), the checkpoint's state edited by ``state_update``, and ``input`` as new
        input; the original run is untouched. `RunStore.fork` only creates the new run.
        """
        state = await self.create_fork(
            run_id, at=at, state_update=state_update, new_run_id=new_run_id, title=title
        )
        return await self.resume(state.run_id, input, context=context)

    async def _open(
        self, state: RunState, index_version: int, context: Any, trace: RunTrace | None
    ) -> ActiveRun:
        if trace is not None:
            trace.adopt(state)
        if context is None and state.context is not None:
            context = self.context_codec.load(state.context)
        session = await self.sessions.get(state.session_id)
        writer = CheckpointWriter(
            self.runs,
            self.checkpoints.write_mode,
            revision=state.revision,
            index_version=index_version,
            owner=self.owner,
            lease_ttl=self.coordination.lease_ttl,
            lifecycle=self.lifecycle,
        )
        active = ActiveRun(state, writer, await session.messages(), context, trace=trace)
        active.seen_seq = session.record.last_seq
        return active

    # -- decisions, cancel, limits -------------------------------------------------------

    async def approve(
        self,
        run_id: str,
        call_id: str,
        *,
        always: bool = False,
        reason: str | None = None,
        by: str | None = None,
        arguments: str | Mapping[str, Any] | None = None,
    ) -> RunState:
        """Approve a pending tool call (``always``: every later call of that tool too;
        ``arguments``: run it with these edited arguments, a JSON object)."""
        return await self.approvals.decide(
            run_id, call_id, approved=True, always=always, reason=reason, by=by, arguments=arguments
        )

    async def reject(
        self,
        run_id: str,
        call_id: str,
        *,
        always: bool = False,
        reason: str | None = None,
        by: str | None = None,
    ) -> RunState:
        """Reject a pending tool call; the model gets the rejection, with ``reason`` (a
        message to it), as the call's result."""
        return await self.approvals.decide(
            run_id, call_id, approved=False, always=always, reason=reason, by=by
        )

    async def cancel(self, run_id: str, reason: str | None = None) -> RunState:
        """Cancel a run: a running one stops before its next step, a stopped one at once."""
        index = await self.runs.request_cancel(run_id)
        self.loop.request_cancel(run_id)
        state, index_version, session_version = await self.runs.load(run_id)
        if (
            index.owner not in (None, self.owner)
            and index.lease_until
            and index.lease_until > utcnow()
        ):
            return state  # its owner will see the flag at its next step
        if self.loop.driving(run_id) or state.status in FINISHED:
            return state
        self.lifecycle.cancel(state, reason)
        saved = await self.runs.save(
            state, index_version=index_version, session_version=session_version
        )
        payload = {"reason": reason or "cancelled"}
        await self.lifecycle.publish(state, "lifecycle", "abort", payload)
        return saved.state

    async def raise_limits(
        self,
        run_id: str,
        *,
        iterations: int | None = None,
        budget: float | None = None,
        tokens: int | None = None,
        seconds: float | None = None,
    ) -> RunState:
        """Give a stopped run room: the given new maxima (never lower than before, above
        what was used), or, with none given, each reached limit's ``increase_amount``.

        Headless or interactive; `InvalidInputError` (nothing written) when it cannot,
        `ConflictError` while another live process is driving the run.
        """
        # A run another process is driving would overwrite the new limits with its next
        # checkpoint: refused, as `resume` refuses it.
        check_not_held((await self.runs.index(run_id))[0], self.owner)
        state, index_version, session_version = await self.runs.load(run_id)
        raise_run_limits(
            state, iterations=iterations, budget=budget, tokens=tokens, seconds=seconds
        )
        saved = await self.runs.save(
            state, index_version=index_version, session_version=session_version
        )
        return saved.state

    async def load(self, run_id: str) -> RunState:
        """The run's latest checkpoint (with the usage of children that ended unreported)."""
        await settle_children(self.runs, run_id, self.coordination.track_child)
        return (await self.runs.load(run_id))[0]

    async def session_stats(self, session_id: str) -> SessionStats:
        """Conversation statistics: cost and tokens of the session's runs, per model."""
        return await session_stats(self.runs, session_id)

    async def compact(
        self, run_id: str, summarize: Summarizer, *, keep_last: int = 4
    ) -> CompactionResult:
        """Compact the run's session now, publishing ``compaction/start`` and
        ``compaction/complete`` as events of the run (a failure is published, then
        raised). A run being driven sees the compacted view from its next resume."""
        state = await self.load(run_id)
        session = await self.sessions.get(state.session_id)
        return await compact_published(
            session,
            summarize,
            keep_last=keep_last,
            lifecycle=self.lifecycle,
            state=state,
            trigger="manual",
        )

    # -- delegation ----------------------------------------------------------------------

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

        The child's budget and token limits (``limits``, default the policy's) are capped
        by the parent's room minus what its live siblings reserved, and reserved until
        it ends (`LimitReachedError`, nothing started, when no room is left); its usage
        rolls up into the parent (see `statekeeper.runs.rollup`). The child is
        registered in the subagent registry, which follows it (running, paused, ended).
        """
        return await start_child(
            self,
            parent,
            agent,
            input,
            own_session=own_session,
            headless=headless,
            limits=limits,
            task=task,
        )
