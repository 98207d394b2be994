"""``statekeeper gc``: delete runs and sessions older than a date or an age.

What goes and in which order is `statekeeper.runs.retention.sweep`'s policy; this
module parses the options and prints the report.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    JsonFlag,
    console,
    ids_whole,
    parse_when,
    print_json,
    run,
    stamp,
    wants_json,
)
from statekeeper.runs.retention import Sweep, sweep
from statekeeper.stores import Store

__all__ = ["gc"]

Before = Annotated[
    str,
    typer.Option(
        "--before",
        metavar="DATE_OR_AGE",
        help="ISO 8601 date/time (UTC unless it has a zone) or an age: 30d, 12h, 1d12h.",
        show_default=False,
    ),
]


def gc(
    ctx: typer.Context,
    before: Before,
    sessions: Annotated[
        bool, typer.Option("--sessions/--no-sessions", help="Delete old sessions.")
    ] = True,
    runs: Annotated[bool, typer.Option("--runs/--no-runs", help="Delete old runs.")] = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only list what would be deleted.")
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Delete runs (last updated) and sessions (last active) older than --before.

    Runs go first. A session that a newer run uses, or that a newer fork reads its
    history from, is kept, and so is a run that a newer child run reports to.
    """
    try:
        when = parse_when(before)
    except typer.BadParameter as exc:
        exc.param_hint = "'--before'"
        raise

    async def work(store: Store, tenant: str) -> Sweep:
        return await sweep(store, tenant, when, runs=runs, sessions=sessions, dry_run=dry_run)

    report = run(ctx, work)
    if wants_json(ctx, json_output):
        print_json(
            {
                "before": when.isoformat(),
                "dry_run": dry_run,
                "runs": [r.id for r in report.runs],
                "sessions": [s.id for s in report.sessions],
                "kept_runs": [r.id for r in report.kept_runs],
                "kept_sessions": [s.id for s in report.kept_sessions],
            }
        )
        return
    _print_sweep(report)


def _print_sweep(report: Sweep) -> None:
    out = console()
    cutoff = stamp(report.before)
    if report.dry_run and (report.runs or report.sessions):
        table = Table(title=f"Older than {cutoff} UTC")
        for column in ("kind", "id", "last change (UTC)", "status / title"):
            table.add_column(column)
        for kind, items in (("run", report.runs), ("session", report.sessions)):
            for item in items:
                table.add_row(kind, Text(item.id), stamp(item.changed_at), Text(item.label))
        out.print(ids_whole(table))
    verb = "would delete" if report.dry_run else "deleted"
    out.print(
        Text(
            f"{verb} {len(report.runs)} run(s) and {len(report.sessions)} session(s) "
            f"older than {cutoff} UTC"
        )
    )
    if report.kept_runs or report.kept_sessions:
        kept = [item.id for item in (*report.kept_runs, *report.kept_sessions)]
        out.print(
            Text(
                f"kept {len(report.kept_runs)} older run(s) and {len(report.kept_sessions)} "
                f"older session(s) that newer runs or forks still need: {', '.join(kept)}"
            )
        )
