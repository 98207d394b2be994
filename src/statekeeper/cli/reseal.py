"""``statekeeper reseal``: move a tenant's rows to the keyring's current key.

The keyring is named, never given: ``--keyring env:VARIABLE`` or ``--keyring
file:PATH`` (or ``?keyring=...`` in ``--store``), so no key reaches the command line or
the shell history. The work is `statekeeper.stores.sealed.reseal.reseal`'s; this module
adds the options, a progress bar and the report.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated
from urllib.parse import quote

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from statekeeper.cli._common import JsonFlag, console, print_json, run, settings, wants_json
from statekeeper.stores import Store
from statekeeper.stores.sealed.reseal import BUILTIN_NAMESPACES, ResealReport, reseal

__all__ = ["reseal_command"]

KeyringOption = Annotated[
    str | None,
    typer.Option(
        "--keyring",
        metavar="SOURCE",
        help="Where the keyring is: env:VARIABLE or file:PATH (its current key seals; "
        "keep the old keys in it). Not needed when --store names it.",
    ),
]
NamespaceOption = Annotated[
    list[str] | None,
    typer.Option(
        "--namespace",
        metavar="NAME",
        help="Record namespace to reseal (repeat it); default: statekeeper's own "
        f"({', '.join(BUILTIN_NAMESPACES)}). Add ltm.<name> for a long-term store.",
    ),
]


def reseal_command(
    ctx: typer.Context,
    keyring: KeyringOption = None,
    namespace: NamespaceOption = None,
    allow_plain: Annotated[
        bool, typer.Option("--allow-plain", help="Also seal rows written before encryption.")
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Reseal the tenant's session heads and records with the current key.

    Safe while the store is in use, and to run again. Transcript entries are append-only:
    they are counted by key, and those keys must stay in the keyring.
    """
    url = settings(ctx).store
    options = [f"keyring={quote(keyring, safe=':/')}"] if keyring else []
    if allow_plain:
        options.append("allow_plain=true")
    if options:
        url += ("&" if "?" in url else "?") + "&".join(options)
    ctx.obj = replace(settings(ctx), store=url)
    namespaces = tuple(namespace) if namespace else BUILTIN_NAMESPACES
    quiet = wants_json(ctx, json_output)

    async def work(store: Store, tenant: str) -> ResealReport:
        columns = (
            TextColumn("sessions"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        )  # fmt: skip
        with Progress(*columns, console=console(stderr=True), disable=quiet) as bar:
            task = bar.add_task("reseal", total=None)

            def advance(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            return await reseal(store, tenant, namespaces=namespaces, progress=advance)

    _print_report(run(ctx, work), quiet)


def _print_report(report: ResealReport, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "sessions": report.sessions,
                "sessions_resealed": report.sessions_resealed,
                "records": report.records,
                "records_resealed": report.records_resealed,
                "raced": report.raced,
                "entries_by_key": dict(report.entries),
            }
        )
        return
    out = console()
    out.print(
        f"resealed {report.sessions_resealed} of {report.sessions} session heads and "
        f"{report.records_resealed} of {report.records} records"
        + (f"; {report.raced} changed meanwhile (run again)" if report.raced else "")
    )
    for key_id, count in sorted(report.entries.items()):
        out.print(f"  {count} transcript entries sealed with {key_id}")
