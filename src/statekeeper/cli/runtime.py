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
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    FINISHED_RUNS,
    JsonFlag,
    console,
    print_json,
    run,
    stamp,
    wants_json,
)
from statekeeper.cli._runtime_common import clip, span
from statekeeper.core.messages import utcnow
from statekeeper.runs.operations import (
    OPERATOR_ID,
    Held,
    Killed,
    Lanes,
    Steered,
    kill_subagent,
    lanes_json,
    lanes_of,
    steer_subagent,
)
from statekeeper.runs.store import RunIndex, RunStore
from statekeeper.runtime.subagents import SubagentEntry, SubagentRegistry, SubagentStatus
from statekeeper.stores import Store

__all__ = ["CLI_OWNER", "lanes", "subagents_app"]

CLI_OWNER = OPERATOR_ID
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


@subagents_app.command("kill")
def kill(ctx: typer.Context, run_id: SubagentRunId) -> None:
    """Cancel a running child run and mark its entry killed.

    A stopped run is cancelled at once; a run another process is running stops before
    its next step (its cancel flag is set in the runs index). An entry whose run is not
    in the runs index is only marked killed.
    """
    killed = Killed()

    async def work(store: Store, tenant: str) -> SubagentEntry:
        return await kill_subagent(store, tenant, run_id, killed)

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

    async def work(store: Store, tenant: str) -> Steered:
        return await steer_subagent(store, tenant, run_id, text)

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


def _held_notes(held: Held, first: bool, holders: int) -> str:
    notes = []
    if not held.alive:
        notes.append("owner process is gone")
    if held.index.cancel_requested:
        notes.append("cancel requested")
    if holders > 1 and first:
        notes.append(f"{holders} runs hold this lane")
    return ", ".join(notes)


def _lanes_table(found: Lanes) -> Table:
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

    found = lanes_of(run(ctx, work), utcnow())
    if wants_json(ctx, json_output):
        print_json(lanes_json(found))
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
