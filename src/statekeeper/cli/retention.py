"""``statekeeper gc``: delete runs and sessions older than a date or an age."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    JsonFlag,
    console,
    parse_when,
    print_json,
    run,
    stamp,
    wants_json,
)
from statekeeper.runs.store import RunStore
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

__all__ = ["gc"]


@dataclass
class _Doomed:
    runs: list[tuple[str, datetime, str]] = field(default_factory=list)
    sessions: list[tuple[str, datetime, str]] = field(default_factory=list)


def gc(
    ctx: typer.Context,
    before: Annotated[
        str,
        typer.Option(
            "--before",
            metavar="DATE_OR_AGE",
            help="ISO 8601 date/time (UTC unless it has a zone) or an age: 30d, 12h, 1d12h.",
            show_default=False,
        ),
    ],
    sessions: Annotated[
        bool, typer.Option("--sessions/--no-sessions", help="Delete old sessions.")
    ] = True,
    runs: Annotated[bool, typer.Option("--runs/--no-runs", help="Delete old runs.")] = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only list what would be deleted.")
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Delete runs (last updated) and sessions (last active) older than --before."""
    try:
        when = parse_when(before)
    except typer.BadParameter as exc:
        exc.param_hint = "'--before'"
        raise

    async def work(store: Store, tenant: str) -> _Doomed:
        doomed = _Doomed()
        run_store = RunStore(store, tenant)
        manager = SessionManager(store, tenant)
        if runs:
            old = [r for r in await run_store.list(limit=10**9) if r.updated_at < when]
            doomed.runs = [(r.run_id, r.updated_at, r.status) for r in old]
        if sessions:
            doomed.sessions = [
                (r.id, r.last_active, r.title or "") async for r in manager.iter(active_before=when)
            ]
        if not dry_run:  # runs first: deleting one prunes its checkpoints in its session
            if runs:
                deleted = set(await run_store.delete_before(when))
                doomed.runs = [r for r in doomed.runs if r[0] in deleted]
            if sessions:
                gone = set(await manager.delete_before(when))
                doomed.sessions = [s for s in doomed.sessions if s[0] in gone]
        return doomed

    doomed = run(ctx, work)
    if wants_json(ctx, json_output):
        print_json(
            {
                "before": when.isoformat(),
                "dry_run": dry_run,
                "runs": [r[0] for r in doomed.runs],
                "sessions": [s[0] for s in doomed.sessions],
            }
        )
        return
    out = console()
    verb = "would delete" if dry_run else "deleted"
    if dry_run and (doomed.runs or doomed.sessions):
        table = Table(title=f"Older than {stamp(when)} UTC")
        for column in ("kind", "id", "last change (UTC)", "status / title"):
            table.add_column(column)
        for run_id, updated, status in doomed.runs:
            table.add_row("run", Text(run_id), stamp(updated), Text(status))
        for session_id, active, title in doomed.sessions:
            table.add_row("session", Text(session_id), stamp(active), Text(title))
        out.print(table)
    out.print(
        Text(
            f"{verb} {len(doomed.runs)} run(s) and {len(doomed.sessions)} session(s) "
            f"older than {stamp(when)} UTC"
        )
    )
