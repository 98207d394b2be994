"""``statekeeper subagents|lanes|profiles``: the runtime, as the store records it
(``events tail`` is in `statekeeper.cli.events`).

    subagents         list, kill and steer delegated (child) runs
    lanes             runs that hold a session lane now (from the runs index)
    profiles          list and reset an agent's auth profiles

Everything here works from another process than the one running the agents: kill
cancels through the runs index (`Runner.cancel`), steer appends to the child's session
(the running run reads it at its next step), and lanes are shown as the store sees them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    JsonFlag,
    console,
    fail,
    print_json,
    run,
    stamp,
    wants_json,
)
from statekeeper.cli._runtime_common import clip, reflow, span
from statekeeper.core.messages import Message, utcnow
from statekeeper.errors import NotFoundError
from statekeeper.runs.runner import Runner
from statekeeper.runs.store import RunIndex, RunStore, owner_alive
from statekeeper.runtime.profiles import AuthProfile, AuthProfiles
from statekeeper.runtime.subagents import SubagentEntry, SubagentRegistry, SubagentStatus
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

__all__ = [
    "CLI_OWNER",
    "lanes",
    "profiles_app",
    "subagents_app",
]

CLI_OWNER = "statekeeper-cli"
"""The worker id of the CLI's subagent registry (it never registers or owns children)."""

_FINISHED_RUNS = frozenset({"completed", "error", "cancelled"})

F = TypeVar("F", bound=Callable[..., Any])


subagents_app = typer.Typer(
    help="List, kill and steer subagent (delegated child) runs.", no_args_is_help=True
)

SubagentRunId = Annotated[str, typer.Argument(help="The child run's id.", show_default=False)]


@subagents_app.command("list")
def list_subagents(
    ctx: typer.Context,
    requester: Annotated[
        str | None,
        typer.Option(
            "--requester", metavar="SESSION", help="Only children of this requester session."
        ),
    ] = None,
    status: Annotated[SubagentStatus | None, typer.Option(help="Only children in this status.")] = (
        None
    ),
    json_output: JsonFlag = False,
) -> None:
    """List subagent runs, oldest start first."""

    async def work(store: Store, tenant: str) -> list[SubagentEntry]:
        registry = SubagentRegistry(store, tenant, owner_id=CLI_OWNER)
        return await registry.list(requester=requester, status=status)

    entries = run(ctx, work)
    if wants_json(ctx, json_output):
        print_json({"items": [entry.model_dump(mode="json") for entry in entries]})
        return
    out = console()
    if not entries:
        out.print("No subagent runs.")
        return
    now = utcnow()
    table = Table()
    columns = ("run", "status", "task", "requester", "child session", "owner", "started (UTC)")
    for column in (*columns, "ended / heartbeat", "outcome"):
        table.add_column(column, overflow="fold" if column in ("task", "outcome") else "ellipsis")
    for entry in entries:
        if entry.completed_at is not None:
            when = stamp(entry.completed_at)
        else:
            when = f"heartbeat {span((now - entry.heartbeat_at).total_seconds())} ago"
        table.add_row(
            Text(entry.run_id),
            Text(entry.status),
            Text(clip(entry.task, 80)),
            Text(entry.requester_session_id),
            Text(entry.child_session_id),
            Text(entry.owner),
            stamp(entry.started_at),
            when,
            Text(entry.outcome or ""),
        )
    out.print(table)


@dataclass
class _Killed:
    before: str | None = None
    """The run's status before the cancel; None when the run is not in the runs index."""
    after: str | None = None
    owner: str | None = None


@subagents_app.command("kill")
@reflow
def kill(ctx: typer.Context, run_id: SubagentRunId) -> None:
    """Cancel a running child run and mark its entry killed.

    A stopped run is cancelled at once; a run another process is running stops before
    its next step (its cancel flag is set in the runs index). An entry whose run is not
    in the runs index is only marked killed.
    """
    killed = _Killed()

    async def work(store: Store, tenant: str) -> SubagentEntry:
        runner = Runner(store, tenant, agents=[])

        async def cancel(child: str) -> None:
            try:
                await runner.runs.index(child)
            except NotFoundError:
                return  # not in the runs index: nothing to cancel, only the entry to mark
            killed.before = str((await runner.load(child)).status)
            state = await runner.cancel(child, "killed with `statekeeper subagents kill`")
            killed.after = str(state.status)
            killed.owner = (await runner.runs.index(child))[0].owner

        registry = SubagentRegistry(store, tenant, owner_id=CLI_OWNER, kill=cancel)
        return await registry.kill(run_id)

    entry = run(ctx, work)
    out = console()
    if entry.status != SubagentStatus.KILLED:
        out.print(Text(f"subagent run {run_id} finished ({entry.status}) before it was killed"))
        return
    if killed.before is None:
        note = "its run is not in the runs index, so there was nothing to cancel"
    elif killed.before in _FINISHED_RUNS:
        note = f"its run was already {killed.before}"
    elif killed.after == "cancelled":
        note = f"run cancelled (was {killed.before})"
    else:
        by = f" by {killed.owner}" if killed.owner else ""
        note = f"cancel requested: the run is being run{by}; it stops before its next step"
    out.print(Text(f"killed subagent run {run_id}: {note}"))


@dataclass
class _Steered:
    session_id: str = ""
    seq: int | None = None
    run_status: str | None = None
    """The run's status in the runs index; None when the run is not in it."""


def _steer_refusal(run_id: str, status: str) -> str | None:
    """Why a run in ``status`` must not be steered (None: it may be)."""
    if status == "waiting_for_approval":
        return (
            f"run {run_id} is waiting for approval: a message now would land between its "
            "tool call and the call's result; decide the call first (`statekeeper runs "
            "approve|reject`)"
        )
    if status == "waiting_for_input":
        return (
            f"run {run_id} is waiting for input, not running: give it the text with "
            f"`statekeeper runs resume {run_id} --input TEXT --app ...` instead"
        )
    if status in _FINISHED_RUNS:
        return f"run {run_id} is already {status}: no run reads a steering message any more"
    return None


@subagents_app.command("steer")
@reflow
def steer(
    ctx: typer.Context,
    run_id: SubagentRunId,
    text: Annotated[str, typer.Argument(help="The message to send.", show_default=False)],
) -> None:
    """Send a user message to a running child run.

    The text is appended to the child's session as a user message; a run in progress
    (in any process) reads it as new input at its next step. Runs waiting for approval
    or input, and finished runs, are refused: decide, resume or start them instead.
    """
    steered = _Steered()

    async def work(store: Store, tenant: str) -> _Steered:
        # No automatic continuation: the message must land in the session the run reads.
        manager = SessionManager(store, tenant, auto_continue=False)

        async def append(child: str, message: Message) -> None:
            entry = await registry.get(child)
            try:
                steered.run_status = (await RunStore(store, tenant).index(child))[0].status
            except NotFoundError:
                steered.run_status = None  # cannot tell: append anyway
            else:
                refusal = _steer_refusal(child, steered.run_status)
                if refusal is not None:
                    fail(refusal)
            session = await manager.get(entry.child_session_id)
            outcome = await session.append(message, strict=False)
            steered.session_id = outcome.session_id
            steered.seq = outcome.entries[-1].seq if outcome.entries else None

        registry = SubagentRegistry(store, tenant, owner_id=CLI_OWNER, steer=append)
        await registry.steer(run_id, Message.user(text))
        return steered

    done = run(ctx, work)
    at = f" (entry {done.seq})" if done.seq is not None else ""
    out = console()
    out.print(Text(f"steered subagent run {run_id}: appended to session {done.session_id}{at}"))
    if done.run_status is None:
        note = "the run is not in the runs index; a run in progress reads it at its next step"
    elif done.run_status in ("initializing", "running"):
        note = "the run reads it as new input at its next step"
    else:
        note = f"the run is {done.run_status}: it sees the message in its history when resumed"
    out.print(Text(note))


# -- lanes ----------------------------------------------------------------------------------


@dataclass
class _Held:
    index: RunIndex
    alive: bool


def _held_json(held: _Held, now: datetime) -> dict[str, Any]:
    index = held.index
    assert index.lease_until is not None
    return {
        "run_id": index.run_id,
        "status": index.status,
        "agent": index.agent,
        "owner": index.owner,
        "owner_alive": held.alive,
        "lease_until": index.lease_until.isoformat(),
        "lease_left_seconds": round((index.lease_until - now).total_seconds(), 3),
        "updated_at": index.updated_at.isoformat(),
        "since_update_seconds": round((now - index.updated_at).total_seconds(), 3),
        "cancel_requested": index.cancel_requested,
    }


@reflow
def lanes(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Session lanes held now, as the store sees them: runs with a live lease, by session.

    Command lanes are in-process queues, so this command has none of its own. What the
    store knows is the per-session serialisation: a run being executed holds a lease
    (owner, lease_until) in the runs index, shown here grouped by its lane
    session:<id>, with its status, owner, lease and last checkpoint. The store keeps no
    time at which a lease was taken. Queue lengths, running counts and waits are only
    known in the process itself: CommandLanes.stats() there.
    """

    async def work(store: Store, tenant: str) -> list[RunIndex]:
        return await RunStore(store, tenant).list(limit=sys.maxsize)

    runs = run(ctx, work)
    now = utcnow()
    groups: dict[str, list[_Held]] = {}
    expired: list[RunIndex] = []
    for index in runs:
        if index.owner is None:
            continue
        if index.lease_until is None or index.lease_until <= now:
            expired.append(index)
            continue
        held = _Held(index, owner_alive(index.owner))
        groups.setdefault(f"session:{index.session_id}", []).append(held)
    if wants_json(ctx, json_output):
        print_json(
            {
                "lanes": [
                    {"lane": lane, "runs": [_held_json(h, now) for h in items]}
                    for lane, items in sorted(groups.items())
                ],
                "expired_leases": [
                    {
                        "run_id": index.run_id,
                        "lane": f"session:{index.session_id}",
                        "status": index.status,
                        "owner": index.owner,
                        "lease_until": index.lease_until.isoformat() if index.lease_until else None,
                    }
                    for index in expired
                ],
            }
        )
        return
    out = console()
    if not groups:
        out.print("No session lane is held: no run has a live lease.")
    else:
        table = Table(title=f"Held session lanes ({len(groups)})")
        columns = ("lane", "run", "status", "agent", "owner", "lease left")
        for column in (*columns, "last checkpoint", "notes"):
            table.add_column(column)
        for lane, items in sorted(groups.items()):
            for i, held in enumerate(items):
                index = held.index
                assert index.lease_until is not None
                notes = []
                if not held.alive:
                    notes.append("owner process is gone")
                if index.cancel_requested:
                    notes.append("cancel requested")
                if len(items) > 1 and i == 0:
                    notes.append(f"{len(items)} runs hold this lane")
                table.add_row(
                    Text(lane if i == 0 else ""),
                    Text(index.run_id),
                    Text(index.status),
                    Text(index.agent),
                    Text(index.owner or ""),
                    span((index.lease_until - now).total_seconds()),
                    f"{span((now - index.updated_at).total_seconds())} ago",
                    Text(", ".join(notes)),
                )
        out.print(table)
    if expired:
        ids = ", ".join(index.run_id for index in expired)
        out.print(
            Text(f"{len(expired)} run(s) have an expired lease (not released by its owner): {ids}")
        )
    out.print(
        Text(
            "in-process lane statistics (queued, running, waits): CommandLanes.stats() "
            "in the process that runs the agents",
            style="dim",
        )
    )


# -- auth profiles --------------------------------------------------------------------------

profiles_app = typer.Typer(
    help="List and reset an agent's auth profiles (API key rotation).", no_args_is_help=True
)

AgentOption = Annotated[
    str, typer.Option("--agent", metavar="AGENT", help="The agent id.", show_default=False)
]


def mask_secret(ref: str) -> str:
    """A secret reference with only its scheme left: ``env:OPENAI_KEY`` -> ``env:…``."""
    scheme, sep, _ = ref.partition(":")
    return f"{scheme}:…" if sep else "…"


def _profile_json(profile: AuthProfile, now: datetime) -> dict[str, Any]:
    data = profile.model_dump(mode="json", exclude={"secret_ref"})
    return {**data, "secret_ref": mask_secret(profile.secret_ref), "cooling": profile.cooling(now)}


def _cooldown(profile: AuthProfile, now: datetime) -> str:
    until = profile.cooldown_until
    if until is None:
        return ""
    if profile.cooling(now):
        return f"{stamp(until)} (in {span((until - now).total_seconds())})"
    return f"{stamp(until)} (over)"


@profiles_app.command("list")
@reflow
def list_profiles(ctx: typer.Context, agent: AgentOption, json_output: JsonFlag = False) -> None:
    """List an agent's auth profiles: use, cooldown and failures (secrets show only their
    scheme, e.g. env:…)."""

    async def work(store: Store, tenant: str) -> list[AuthProfile]:
        return await AuthProfiles(store, tenant, agent).list()

    profiles = run(ctx, work)
    now = utcnow()
    if wants_json(ctx, json_output):
        print_json({"agent": agent, "items": [_profile_json(p, now) for p in profiles]})
        return
    out = console()
    if not profiles:
        out.print(Text(f"Agent {agent} has no auth profiles."))
        return
    table = Table(title=f"Auth profiles of agent {agent}")
    columns = ("id", "label", "secret", "uses", "last used (UTC)", "cooldown until (UTC)")
    for column in (*columns, "failures", "reason"):
        table.add_column(column, justify="right" if column in ("uses", "failures") else "left")
    for profile in profiles:
        table.add_row(
            Text(profile.id),
            Text(profile.label),
            Text(mask_secret(profile.secret_ref)),
            str(profile.usage_count),
            stamp(profile.last_used),
            _cooldown(profile, now),
            str(profile.failure_count),
            Text(profile.failure_reason or "", overflow="fold"),
        )
    out.print(table)


@profiles_app.command("reset")
def reset_profiles(
    ctx: typer.Context,
    agent: AgentOption,
    profile_id: Annotated[
        str | None,
        typer.Argument(help="The profile to reset (default: every profile of the agent)."),
    ] = None,
) -> None:
    """Clear cooldowns and failure streaks of an agent's profiles (one, or all)."""

    async def work(store: Store, tenant: str) -> list[AuthProfile]:
        profiles = AuthProfiles(store, tenant, agent)
        if profile_id is not None:
            before = [await profiles.get(profile_id)]
        else:
            before = await profiles.list()
            if not before:  # reset() would store an empty record for an unknown agent
                fail(f"agent {agent!r} has no auth profiles")
        await profiles.reset(profile_id)
        return before

    before = run(ctx, work)
    now = utcnow()
    cooling = sum(1 for p in before if p.cooling(now))
    failures = sum(p.failure_count for p in before)
    what = f"profile {profile_id}" if profile_id is not None else f"{len(before)} profile(s)"
    console().print(
        Text(
            f"reset {what} of agent {agent}: cleared {cooling} cooldown(s) "
            f"and {failures} failure(s) in a row"
        )
    )
