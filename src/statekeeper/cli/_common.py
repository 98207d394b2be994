"""Plumbing shared by the commands: global options, the store, output and errors.

Every command follows one shape: parse its arguments, run one coroutine against the
opened store with `run` (which closes the store whatever happens and turns a
`StatekeeperError` into one red ``error: ...`` line and exit code 1), then print.
File reads and writes happen outside the event loop, before or after `run`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from statekeeper.core.messages import Message, TextBlock, ToolCallBlock, ToolResultBlock
from statekeeper.errors import StatekeeperError
from statekeeper.jsoncodec import MAX_JSON_DEPTH
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import CorruptItem

__all__ = [
    "DEFAULT_STORE",
    "DEFAULT_TENANT",
    "FINISHED_RUNS",
    "JsonFlag",
    "OutputFile",
    "Settings",
    "console",
    "fail",
    "fields_table",
    "ids_whole",
    "load_json",
    "message_text",
    "parse_when",
    "print_corrupt",
    "print_json",
    "read_input",
    "run",
    "settings",
    "stamp",
    "wants_json",
    "write_output",
]

DEFAULT_STORE = "sqlite:///.statekeeper/state.db"
DEFAULT_TENANT = "default"
FINISHED_RUNS = frozenset({"completed", "error", "cancelled"})
"""Run statuses after which nothing runs again (an ERROR run can still be cancelled)."""
_PIPE_WIDTH = 200  # output that is not a terminal is not squeezed into 80 columns

T = TypeVar("T")

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print machine-readable JSON (same as the global --json).")
]
OutputFile = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="Write to this file instead of stdout.", dir_okay=False),
]


@dataclass(frozen=True)
class Settings:
    """The global options, kept on the click context for every command."""

    store: str = DEFAULT_STORE
    tenant: str = DEFAULT_TENANT
    json: bool = False


def settings(ctx: typer.Context) -> Settings:
    """The global options of this invocation."""
    found = ctx.find_object(Settings)
    return found if found is not None else Settings()


def wants_json(ctx: typer.Context, flag: bool) -> bool:
    """Whether to print JSON: the command's own ``--json`` or the global one."""
    return flag or settings(ctx).json


def run(
    ctx: typer.Context,
    work: Callable[[Store, str], Coroutine[Any, Any, T]],
    *,
    read_only: bool = False,
    create: bool = False,
) -> T:
    """Open the store, await ``work(store, tenant)``, close the store; errors end the command.

    A local store (sqlite, files) must exist unless ``create``: a typo'd ``--store``
    ends in one clear error line instead of a new empty store. ``read_only`` opens
    SQLite with ``mode=ro``.
    """
    config = settings(ctx)
    url = config.store
    if not create:
        _must_exist(url)
        if read_only and url.startswith("sqlite:") and "mode=" not in url:
            url += ("&" if "?" in url else "?") + "mode=ro"

    async def main() -> T:
        store = await open_store(url)
        try:
            return await work(store, config.tenant)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except StatekeeperError as exc:
        fail(str(exc))


def _local_path(url: str) -> Path | None:
    """The file or folder of a sqlite:// or files:// URL (None for other stores)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("sqlite", "files"):
        return None
    location = rest.partition("?")[0]
    if scheme == "sqlite":
        location = location[1:] if location.startswith("/") else location
    return Path(location) if location else None


def _must_exist(url: str) -> None:
    path = _local_path(url)
    if path is None or path.exists():
        return
    fail(
        f"the store {url} does not exist ({path} is missing); check --store or "
        f"STATEKEEPER_STORE (default {DEFAULT_STORE}). Commands that only read never "
        "create a store; `sessions import` and `runs import` do"
    )


# -- output ---------------------------------------------------------------------------------


def console(*, stderr: bool = False) -> Console:
    """A console on the current stdout (or stderr); wide when not a terminal."""
    out = Console(stderr=stderr, highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = _PIPE_WIDTH
    return out


def fail(message: str) -> NoReturn:
    """Print ``error: message`` as one red line on stderr and exit with code 1."""
    line = Text("error: " + " ".join(message.split()), style="red")
    console(stderr=True).print(line, soft_wrap=True)
    raise typer.Exit(1)


YesFlag = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def stdin_is_interactive() -> bool:
    """Whether a confirmation can be asked (tests replace this)."""
    return sys.stdin.isatty()


def confirm_delete(what: str, question: str, yes: bool) -> bool:
    """Whether to delete ``what`` ("run r1"): yes with ``--yes``, else the user's answer
    to ``question``; fails when no one can be asked (stdin is not a terminal)."""
    if yes:
        return True
    if not stdin_is_interactive():
        fail(
            f"not deleting {what}: stdin is not a terminal, so no confirmation can be "
            "asked; pass --yes to delete without asking"
        )
    return typer.confirm(question, default=False)


def report_deleted(what: str, deleted: bool) -> None:
    """Say what a delete command did; exit 1 when the user said no."""
    if not deleted:
        console().print("Nothing deleted.")
        raise typer.Exit(1)
    console().print(Text(f"deleted {what}"))


def print_json(data: Any) -> None:
    """Print plain JSON on stdout (no colours, no wrapping)."""
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def print_corrupt(out: Console, what: str, items: Sequence[CorruptItem]) -> None:
    """One line per damaged item a listing reported: its id, what is wrong, what to do."""
    for item in items:
        line = Text(f"damaged {what} {item.id}: ", style="bold red")
        out.print(line.append(Text(item.error, style="red")))


def stamp(when: datetime | None) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS`` in UTC (empty for None)."""
    if when is None:
        return ""
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S")


ID_COLUMNS = frozenset({"id", "run", "session", "call id", "entry", "loaded instead"})
"""Column headers whose cells are ids: never cut (the other columns give way)."""


def _cell_width(cell: object) -> int:
    """The columns a table cell's text takes (a str cell is markup, as rich reads it)."""
    text = Text.from_markup(cell) if isinstance(cell, str) else cell
    return text.cell_len if isinstance(text, Text) else 0


def ids_whole(table: Table) -> Table:
    """``table`` with its id columns (`ID_COLUMNS`) kept whole on one line: at 80
    columns rich would cut every id to the same prefix (``ses_01a2215b…``)."""
    for column in table.columns:
        if str(column.header) in ID_COLUMNS:
            widest = max(map(_cell_width, column.cells), default=0)
            column.no_wrap = True
            column.min_width = max(widest, len(str(column.header)))
    return table


def fields_table(rows: list[tuple[str, object]], *, title: str | None = None) -> Table:
    """A two-column table of ``name: value`` rows; values are shown literally (no markup)."""
    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in rows:
        if value is None or value == "":
            continue
        table.add_row(name, value if isinstance(value, Text) else Text(str(value)))
    return table


def message_text(message: Message, *, limit: int | None = None) -> Text:
    """A message's text plus its tool calls and results, as literal text."""
    parts: list[str] = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolCallBlock):
            parts.append(f"-> {block.name}({block.arguments}) [{block.id}]")
        elif isinstance(block, ToolResultBlock):
            flag = " (error)" if block.is_error else ""
            parts.append(f"<- [{block.tool_call_id}]{flag} {block.content}")
        else:
            parts.append(f"[{getattr(block, 'type', type(block).__name__)}]")
    joined = "\n".join(parts)
    if limit is not None and len(joined) > limit:
        joined = joined[: limit - 1] + "…"
    return Text(joined)


# -- input ----------------------------------------------------------------------------------


def read_input(path: str) -> bytes:
    """The bytes of ``path`` (``-`` reads stdin); a failure ends the command."""
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")


def load_json(data: bytes, source: str) -> Any:
    """Parse JSON read from ``source``; invalid JSON ends the command."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        fail(f"{source} is not valid JSON: {exc}")
    except RecursionError:
        fail(f"{source} is nested too deeply; the limit is {MAX_JSON_DEPTH} levels")


def write_output(text: str, path: Path | None) -> None:
    """Write ``text`` to ``path``, or to stdout when ``path`` is None."""
    if path is None:
        typer.echo(text)
        return
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_when(value: str, *, now: datetime | None = None) -> datetime:
    """A moment from an ISO 8601 date/time (UTC if it has no zone) or an age like ``30d``.

    Ages are one or more ``<number><unit>`` with units s, m, h, d, w (``1d12h``), and
    mean that long before now. A bad value raises `typer.BadParameter` (exit code 2).
    """
    text = value.strip().lower()
    if text and _DURATION.sub("", text).strip() == "":
        try:
            delta = timedelta()
            for amount, unit in _DURATION.findall(text):
                delta += timedelta(**{_UNITS[unit]: float(amount)})
            return (now or datetime.now(UTC)) - delta
        except OverflowError:
            raise typer.BadParameter(
                f"{value!r} is too far back (before the year 1); pass a smaller age such "
                "as 3650d, or an ISO 8601 date such as 2000-01-01"
            ) from None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is neither an ISO 8601 date (2024-05-01, 2024-05-01T12:00:00Z) "
            "nor an age such as 30d, 12h or 1d12h"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
