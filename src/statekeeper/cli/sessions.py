"""``statekeeper sessions ...``: list, show, fork, export, import and delete sessions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    JsonFlag,
    OutputFile,
    YesFlag,
    confirm_delete,
    console,
    fail,
    fields_table,
    ids_whole,
    load_json,
    message_text,
    print_corrupt,
    print_json,
    read_input,
    report_deleted,
    run,
    stamp,
    wants_json,
    write_output,
)
from statekeeper.core.messages import Message
from statekeeper.errors import AlreadyExistsError, StoreCorruptError
from statekeeper.runs import RunStore, SessionStats, session_stats
from statekeeper.runs.operations import check_no_live_runs
from statekeeper.sessions import SessionManager
from statekeeper.sessions.basics import branch_origins, message_origins
from statekeeper.sessions.view import TranscriptView
from statekeeper.stores import Store
from statekeeper.stores.base import Entry, EntryKind, Page, SessionRecord

__all__ = ["app"]

app = typer.Typer(
    help="List, inspect, fork, export, import and delete sessions.", no_args_is_help=True
)

SessionId = Annotated[str, typer.Argument(help="The session id.", show_default=False)]


def _links(record: SessionRecord) -> str:
    links = []
    if record.continued_from:
        links.append(f"continues {record.continued_from}")
    if record.continued_to:
        links.append(f"continued in {record.continued_to}")
    if record.forked_from:
        links.append(f"fork of {record.forked_from.session_id}@{record.forked_from.seq}")
    return ", ".join(links)


@app.command("list")
def list_sessions(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Sessions per page.")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="Continue from the cursor a previous page printed.")
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only sessions of this agent id.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """List sessions, most recently active first, one page at a time."""

    async def work(store: Store, tenant: str) -> Page:
        return await SessionManager(store, tenant).list(limit=limit, cursor=cursor, agent_id=agent)

    page = run(ctx, work, read_only=True)
    if wants_json(ctx, json_output):
        items = [record.model_dump(mode="json") for record in page.items]
        corrupt = [item.model_dump(mode="json") for item in page.corrupt]
        print_json({"items": items, "next_cursor": page.next_cursor, "corrupt": corrupt})
        return
    out = console()
    if page.items:
        out.print(_sessions_table(page.items))
    elif not page.corrupt:
        out.print("No sessions." if cursor is None else "No more sessions.")
    print_corrupt(out, "session", page.corrupt)
    if page.next_cursor:
        out.print(Text(f"next cursor: {page.next_cursor}"))


def _sessions_table(records: list[SessionRecord]) -> Table:
    table = Table()
    for column in ("id", "title", "agent", "messages", "tokens", "last active (UTC)", "links"):
        table.add_column(column, justify="right" if column in ("messages", "tokens") else "left")
    for record in records:
        table.add_row(
            Text(record.id),
            Text(record.title or ""),
            Text(record.agent_id or ""),
            str(record.message_count),
            str(record.total_tokens),
            stamp(record.last_active),
            Text(_links(record)),
        )
    return ids_whole(table)


@dataclass
class _Shown:
    record: SessionRecord
    view: TranscriptView
    entries: list[Entry] | None
    stats: SessionStats
    origins: list[str]
    """The session each view message is stored in (a fork's start is its origin's)."""


def _known_summary(entry: Entry) -> Text | None:
    payload = entry.payload
    if entry.kind == EntryKind.MESSAGE:
        message = Message.from_dict(payload)
        return Text(f"{message.role}: ").append_text(message_text(message, limit=160))
    if entry.kind == EntryKind.COMPACTION:
        return Text(
            f"summary of {payload.get('replaced')} messages through entry "
            f"{payload.get('through_seq')}"
        )
    if entry.kind == "checkpoint":
        return Text(
            f"checkpoint {payload.get('revision')} of run {payload.get('run_id')} "
            f"({payload.get('status')})"
        )
    if entry.kind == EntryKind.CORRUPT:
        return Text(f"unreadable: {payload.get('error')}", style="red")
    return None


def _entry_summary(entry: Entry) -> Text:
    try:
        known = _known_summary(entry)
    except Exception:  # an odd payload is shown raw; it must not stop the listing
        known = None
    if known is not None:
        return known
    text = json.dumps(entry.payload, ensure_ascii=False, default=str)
    return Text(text if len(text) <= 160 else text[:159] + "…")


def _shown_json(shown: _Shown) -> dict[str, Any]:
    record, view = shown.record, shown.view
    active = {e.id for e in view.branch}
    data: dict[str, Any] = {
        "session": record.model_dump(mode="json"),
        "stats": shown.stats.to_dict(),
        "messages": [
            {"session_id": o, "seq": s, **m.to_dict()}
            for o, s, m in zip(shown.origins, view.seqs, view.messages, strict=True)
        ],
        "corrupt": [{"seq": e.seq, "id": e.id, **e.payload} for e in view.corrupt],
    }
    if shown.entries is not None:
        data["entries"] = [
            {
                "seq": e.seq,
                "id": e.id,
                "parent_seq": e.parent_seq,
                "kind": e.kind,
                "created_at": e.created_at.isoformat(),
                "active": e.id in active,
                "payload": e.payload,
            }
            for e in shown.entries
        ]
    return data


def _record_rows(record: SessionRecord) -> list[tuple[str, object]]:
    delivery = record.delivery
    metadata = json.dumps(record.metadata, ensure_ascii=False) if record.metadata else None
    return [
        ("id", record.id),
        ("title", record.title),
        ("agent", record.agent_id),
        ("created", stamp(record.created_at) + " UTC"),
        ("last active", stamp(record.last_active) + " UTC"),
        ("messages", record.message_count),
        ("tokens", f"{record.total_tokens} total, {record.fresh_tokens} in the active view"),
        ("compactions", record.compaction_count or None),
        ("model override", record.model_override),
        ("thinking level", record.thinking_level),
        ("delivery", delivery.model_dump_json(exclude_defaults=True) if delivery else None),
        ("links", _links(record)),
        ("continuation", record.continuation_index or None),
        ("head", f"entry {record.head_seq} of {record.last_seq}"),
        ("version", record.version),
        ("metadata", metadata),
        ("state keys", ", ".join(sorted(record.state))),
    ]


def _entries_table(entries: list[Entry], active: set[str]) -> Table:
    table = Table(title=f"All entries ({len(entries)}); * = on the active branch")
    for column in ("seq", "parent", "kind", "id", "created (UTC)", ""):
        table.add_column(column, justify="right" if column in ("seq", "parent") else "left")
    table.add_column("summary", overflow="fold")
    for entry in entries:
        table.add_row(
            str(entry.seq),
            "" if entry.parent_seq is None else str(entry.parent_seq),
            Text(entry.kind),
            Text(entry.id),
            stamp(entry.created_at),
            "*" if entry.id in active else "",
            _entry_summary(entry),
        )
    return ids_whole(table)


def _stats_table(stats: SessionStats) -> Table:
    runs = len(stats.runs)
    title = f"Conversation statistics: {runs} run{'' if runs == 1 else 's'}"
    table = Table(title=title)
    for column in ("model", "calls", "input", "output", "total tokens", "cost"):
        table.add_column(column, justify="left" if column == "model" else "right")
    rows = [(Text(name), usage) for name, usage in sorted(stats.metrics.models.items())]
    for name, usage in rows:
        tokens = usage.usage
        table.add_row(
            name,
            str(usage.calls),
            str(tokens.input_tokens),
            str(tokens.output_tokens),
            str(tokens.total),
            f"{usage.cost:.6f}",
        )
    total = stats.usage
    table.add_row(
        "total",
        str(stats.calls),
        str(total.input_tokens),
        str(total.output_tokens),
        str(total.total),
        f"{stats.cost:.6f}",
        style="bold",
    )
    return table


def _print_shown(shown: _Shown) -> None:
    record, view = shown.record, shown.view
    out = console()
    out.print(fields_table(_record_rows(record), title=f"Session {record.id}"))
    out.print(_stats_table(shown.stats))
    for run_id in shown.stats.unreadable:
        out.print(Text(f"run {run_id} is unreadable: not counted"), style="red")
    table = Table(title=f"Active view: {len(view.messages)} messages")
    table.add_column("seq", justify="right")
    table.add_column("role")
    table.add_column("content", overflow="fold")
    for origin, seq, message in zip(shown.origins, view.seqs, view.messages, strict=True):
        where = str(seq) if origin == record.id else f"{origin}@{seq}"
        table.add_row(where, str(message.role), message_text(message))
    out.print(table)
    for entry in view.corrupt:
        out.print(
            Text(f"entry {entry.seq} ({entry.id}) is unreadable: {entry.payload.get('error')}"),
            style="red",
        )
    if shown.entries is not None:
        out.print(_entries_table(shown.entries, {e.id for e in view.branch}))


@app.command("show")
def show(
    ctx: typer.Context,
    session_id: SessionId,
    entries: Annotated[
        bool,
        typer.Option(
            "--entries", help="Also list every entry of every branch (seq, parent, kind)."
        ),
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Show a session's record, its conversation statistics (cost and tokens of its
    runs) and the messages of its active view."""

    async def work(store: Store, tenant: str) -> _Shown:
        session = await SessionManager(store, tenant).get(session_id)
        view = await session.view()
        # A fork's view starts with its origin's entries, numbered in the origin.
        origins = await branch_origins(session.manager, session.record)
        if len(origins) != len(view.branch):  # written to meanwhile
            origins = [session.id] * len(view.branch)
        stats = await session_stats(RunStore(store, tenant), session_id)
        listed = await session.entries() if entries else None
        return _Shown(
            session.record, view, listed, stats, message_origins(view, origins, session.id)
        )

    shown = run(ctx, work, read_only=True)
    if wants_json(ctx, json_output):
        print_json(_shown_json(shown))
    else:
        _print_shown(shown)


@app.command("fork")
def fork(
    ctx: typer.Context,
    session_id: SessionId,
    at: Annotated[
        str | None,
        typer.Option(help="Entry seq or entry id to fork at (default: the head).", metavar="ENTRY"),
    ] = None,
    title: Annotated[str | None, typer.Option(help="Title of the new session.")] = None,
    new_id: Annotated[str | None, typer.Option("--id", help="Id of the new session.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Fork a session at an entry into a new session (history is shared, not copied)."""
    point: int | str | None = int(at) if at is not None and at.isdigit() else at

    async def work(store: Store, tenant: str) -> SessionRecord:
        source = await SessionManager(store, tenant).get(session_id)
        return (await source.fork(point, session_id=new_id, title=title)).record

    record = run(ctx, work)
    if wants_json(ctx, json_output):
        print_json({"session": record.model_dump(mode="json")})
        return
    seq = record.forked_from.seq if record.forked_from else point
    console().print(
        Text(
            f"forked {session_id} at entry {seq} into {record.id} ({record.message_count} messages)"
        )
    )


@app.command("export")
def export(ctx: typer.Context, session_id: SessionId, output: OutputFile = None) -> None:
    """Export a session (every branch, and forked-from history) as one JSON document."""

    async def work(store: Store, tenant: str) -> dict[str, Any]:
        return await SessionManager(store, tenant).export(session_id)

    document = run(ctx, work, read_only=True)
    write_output(json.dumps(document, indent=2, ensure_ascii=False), output)
    if output is not None:
        entries = document.get("entries")
        count = len(entries) if isinstance(entries, list) else 0
        console().print(Text(f"exported session {session_id} ({count} entries) to {output}"))


@app.command("import")
def import_(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="A file made by `sessions export` (- for stdin).")],
    new_id: Annotated[
        str | None, typer.Option("--id", help="Import under this id instead of the exported one.")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Import a session exported with `sessions export`."""
    document = load_json(read_input(file), file)

    async def work(store: Store, tenant: str) -> SessionRecord:
        try:
            manager = SessionManager(store, tenant)
            return (await manager.import_(document, session_id=new_id)).record
        except AlreadyExistsError as exc:
            fail(f"{exc}; import it under another id with --id NEW_ID")

    record = run(ctx, work, create=True)
    if wants_json(ctx, json_output):
        print_json({"session": record.model_dump(mode="json")})
        return
    console().print(Text(f"imported session {record.id} ({record.message_count} messages)"))


@app.command("delete")
def delete(
    ctx: typer.Context,
    session_id: SessionId,
    yes: YesFlag = False,
    force: Annotated[
        bool, typer.Option("--force", help="Delete it even while unfinished runs use it.")
    ] = False,
) -> None:
    """Delete a session and its whole transcript (asks first unless --yes; refuses while
    a run that has not finished uses it, unless --force)."""

    async def work(store: Store, tenant: str) -> bool:
        if not force:
            await check_no_live_runs(store, tenant, session_id)
        manager = SessionManager(store, tenant)
        try:
            record: SessionRecord | None = (await manager.get(session_id)).record
        except StoreCorruptError:
            record = None  # a damaged session is deleted like any other: how to clean up
        if record is None:
            question = f"Session {session_id} is damaged (it cannot be read). Delete it?"
        else:
            title = f" {record.title!r}" if record.title else ""
            question = (
                f"Delete session {session_id}{title} and its {record.message_count} messages?"
            )
        if not confirm_delete(f"session {session_id}", question, yes):
            return False
        await manager.delete(session_id)
        return True

    report_deleted(f"session {session_id}", run(ctx, work))
