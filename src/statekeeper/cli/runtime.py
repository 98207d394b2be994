"""``statekeeper subagents|lanes``: the runtime, as the store records it (``events tail``
is in `statekeeper.cli.events`, ``profiles`` in `statekeeper.cli.profiles`).

    subagents         list, kill and steer delegated (child) runs
    lanes             runs that hold a session lane now (from the runs index)

Everything here works from another process than the one running the agents: kill
cancels through the runs index (`Runner.cancel`), steer appends to the child's session
(the running run reads it at its next step), and lanes are shown as the store sees them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    FINISHED_RUNS,
    JsonFlag,
    console,
    fail,
    print_json,
    run,
    stamp,
    wants_json,
)
from statekeeper.cli._runtime_common import clip, span
from statekeeper.core.messages import Message, utcnow
from statekeeper.errors import NotFoundError
from statekeeper.runs.runner import Runner
from statekeeper.runs.store import RunIndex, RunStore, owner_alive
from statekeeper.runtime.subagents import SubagentEntry, SubagentRegistry, SubagentStatus
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

__all__ = ["CLI_OWNER", "lanes", "subagents_app"]

CLI_OWNER = "statekeeper-cli"
"""The worker id of the CLI's subagent registry (it never registers or owns children)."""

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
    elif killed.before in FINISHED_RUNS:
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
    if status in FINISHED_RUNS:
        return f"run {run_id} is already {status}: no run reads a steering message any more"
    return None


@subagents_app.command("steer")
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


@dataclass
class _Lanes:
    """The runs index seen as session lanes at one moment."""

    now: datetime
    held: dict[str, list[_Held]] = field(default_factory=dict)
    """Lane (``session:<id>``) -> the runs with a live lease on it."""
    expired: list[RunIndex] = field(default_factory=list)
    """Runs whose owner let the lease run out without releasing it."""


def _lanes_of(runs: list[RunIndex], now: datetime) -> _Lanes:
    found = _Lanes(now)
    for index in runs:
        if index.owner is None:
            continue
        if index.lease_until is None or index.lease_until <= now:
            found.expired.append(index)
            continue
        held = _Held(index, owner_alive(index.owner))
        found.held.setdefault(f"session:{index.session_id}", []).append(held)
    return found


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


def _lanes_json(found: _Lanes) -> dict[str, Any]:
    return {
        "lanes": [
            {"lane": lane, "runs": [_held_json(h, found.now) for h in items]}
            for lane, items in sorted(found.held.items())
        ],
        "expired_leases": [
            {
                "run_id": index.run_id,
                "lane": f"session:{index.session_id}",
                "status": index.status,
                "owner": index.owner,
                "lease_until": index.lease_until.isoformat() if index.lease_until else None,
            }
            for index in found.expired
        ],
    }


def _held_notes(held: _Held, first: bool, holders: int) -> str:
    notes = []
    if not held.alive:
        notes.append("owner process is gone")
    if held.index.cancel_requested:
        notes.append("cancel requested")
    if holders > 1 and first:
        notes.append(f"{holders} runs hold this lane")
    return ", ".join(notes)


def _lanes_table(found: _Lanes) -> Table:
    now = found.now
    table = Table(title=f"Held session lanes ({len(found.held)})")
    columns = ("lane", "run", "status", "agent", "owner", "lease left")
    for column in (*columns, "last checkpoint", "notes"):
        table.add_column(column)
    for lane, items in sorted(found.held.items()):
        for i, held in enumerate(items):
            index = held.index
            assert index.lease_until is not None
            table.add_row(
                Text(lane if i == 0 else ""),
                Text(index.run_id),
                Text(index.status),
                Text(index.agent),
                Text(index.owner or ""),
                span((index.lease_until - now).total_seconds()),
                f"{span((now - index.updated_at).total_seconds())} ago",
                Text(_held_notes(held, i == 0, len(items))),
            )
    return table


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

    found = _lanes_of(run(ctx, work), utcnow())
    if wants_json(ctx, json_output):
        print_json(_lanes_json(found))
        return
    out = console()
    if found.held:
        out.print(_lanes_table(found))
    else:
        out.print("No session lane is held: no run has a live lease.")
    if found.expired:
        ids = ", ".join(index.run_id for index in found.expired)
        count = len(found.expired)
        out.print(Text(f"{count} run(s) have an expired lease (not released by its owner): {ids}"))
    out.print(
        Text(
            "in-process lane statistics (queued, running, waits): CommandLanes.stats() "
            "in the process that runs the agents",
            style="dim",
        )
    )
