"""``statekeeper reseal``: move a tenant's rows to the keyring's current key.

The keyring is named, never given: ``--keyring env:VARIABLE`` or ``--keyring
file:PATH`` (or ``?keyring=...`` in ``--store``), so no key reaches the command line or
the shell history. The work is `statekeeper.stores.sealed.reseal.reseal`'s; this module
adds the options, a progress bar and the report. ``--check`` writes nothing: it reports
what is sealed with each key id, and exits 1 when a key other than the current one still
seals something (so that key must not be dropped yet).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated
from urllib.parse import quote

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from statekeeper.cli._common import JsonFlag, console, print_json, run, settings, wants_json
from statekeeper.stores import Store
from statekeeper.stores.sealed import SealedStore
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
        help="Another record namespace to reseal (repeat it), added to statekeeper's own "
        f"({', '.join(BUILTIN_NAMESPACES)}), which always are: ltm.<name> for a long-term "
        "store, and your application's own.",
    ),
]

EventLogOption = Annotated[
    list[str] | None,
    typer.Option(
        "--event-log",
        metavar="ID",
        help="Another event log to reseal (repeat it); the logs of the tenant's runs always are.",
    ),
]


def reseal_command(
    ctx: typer.Context,
    keyring: KeyringOption = None,
    namespace: NamespaceOption = None,
    allow_plain: Annotated[
        bool, typer.Option("--allow-plain", help="Also seal rows written before encryption.")
    ] = False,
    event_log: EventLogOption = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Write nothing: report what is still sealed with each key id; exit 1 if a "
            "key other than the current one still seals something.",
        ),
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Reseal the tenant's session heads, transcript entries, events and records with
    the current key.

    Safe while the store is in use, and to run again. When it reports nothing left on an
    old key (or --check exits 0), that key can be dropped from the keyring.
    """
    url = settings(ctx).store
    options = [f"keyring={quote(keyring, safe=':/')}"] if keyring else []
    if allow_plain:
        options.append("allow_plain=true")
    if options:
        url += ("&" if "?" in url else "?") + "&".join(options)
    ctx.obj = replace(settings(ctx), store=url)
    namespaces = tuple(namespace or ())
    quiet = wants_json(ctx, json_output)
    current = ""

    async def work(store: Store, tenant: str) -> ResealReport:
        nonlocal current
        current = store.keyring.current if isinstance(store, SealedStore) else ""
        columns = (
            TextColumn("sessions and event logs"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rows]}"), TimeElapsedColumn(),
        )  # fmt: skip
        with Progress(*columns, console=console(stderr=True), disable=quiet) as bar:
            task = bar.add_task("reseal", total=None, rows="")

            def advance(done: int, total: int, report: ResealReport) -> None:
                rows = f"{report.entries} entries, {report.events} events"
                bar.update(task, completed=done, total=total, rows=rows)

            return await reseal(
                store, tenant, namespaces=namespaces, event_logs=event_log or (),
                progress=advance, check=check,
            )  # fmt: skip

    report = run(ctx, work, read_only=check)
    _print_report(report, current, quiet)
    if check and report.old_keys(current):
        raise typer.Exit(1)


def _print_report(report: ResealReport, current: str, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "sessions": report.sessions,
                "sessions_resealed": report.sessions_resealed,
                "entries": report.entries,
                "entries_resealed": report.entries_resealed,
                "events": report.events,
                "events_resealed": report.events_resealed,
                "records": report.records,
                "records_resealed": report.records_resealed,
                "raced": report.raced,
                "left_by_key": dict(report.left),
                "left_by_kind": {k: dict(v) for k, v in report.left_kinds.items()},
                "sealed_with": dict(report.sealed_with),
                "unbound_entries": report.unbound,
                "current_key": current,
                "namespaces": list(report.namespaces),
                "checked": report.checked,
            }
        )
        return
    out = console()
    seen = (
        f"{report.sessions} session heads, {report.entries} transcript entries, "
        f"{report.events} events and {report.records} records"
    )
    if report.checked:
        out.print(f"checked {seen} (nothing was written)")
    else:
        out.print(
            f"resealed {report.sessions_resealed} of {report.sessions} session heads, "
            f"{report.entries_resealed} of {report.entries} transcript entries, "
            f"{report.events_resealed} of {report.events} events and "
            f"{report.records_resealed} of {report.records} records"
            + (f"; {report.raced} changed meanwhile (run again)" if report.raced else "")
        )
    for key_id, count in sorted(report.sealed_with.items()):
        mark = " (current)" if key_id == current else ""
        out.print(f"  {count} rows sealed with {key_id}{mark}")
    if not report.left:
        out.print(f"  every row gone through is on the current key {current}")
    for key_id, count in sorted(report.left.items()):
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(report.left_kinds[key_id].items()))
        out.print(f"  {count} rows left on {key_id} ({kinds}): keep that key")
    if report.unbound:
        out.print(
            f"  {report.unbound} entries in the format before entries were bound to their "
            "seq: a reseal binds them"
        )
    out.print(
        f"  records gone through: namespaces {', '.join(report.namespaces)}; records of "
        "another namespace are gone through only when named with --namespace"
    )
