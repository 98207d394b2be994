"""The ``statekeeper`` command line: a thin layer over the public API.

    statekeeper [--store URL] [--tenant ID] [--json] sessions list|show|fork|export|import|delete
    statekeeper ... runs list|show|approve|reject|resume|cancel|export|import
    statekeeper ... gc --before DATE_OR_AGE [--dry-run]
    statekeeper ... events tail [--run ID] [--from SEQ] [--stream S ...] [--follow]
    statekeeper ... subagents list|kill|steer
    statekeeper ... lanes
    statekeeper ... profiles list|reset --agent AGENT

``--store`` defaults to ``$STATEKEEPER_STORE`` or ``sqlite:///.statekeeper/state.db``,
``--tenant`` to ``$STATEKEEPER_TENANT`` or ``default``. Expected failures print one red
``error: ...`` line and exit with code 1; usage errors exit with code 2.
Needs the ``cli`` extra (typer and rich).
"""

from __future__ import annotations

from typing import Annotated

try:
    import typer
except ImportError as exc:  # pragma: no cover - only without the extra
    from statekeeper.errors import MissingExtraError

    raise MissingExtraError("the statekeeper command line", "cli") from exc

from statekeeper.cli import runs, sessions
from statekeeper.cli._common import DEFAULT_STORE, DEFAULT_TENANT, Settings
from statekeeper.cli.events import events_app
from statekeeper.cli.retention import gc
from statekeeper.cli.runtime import lanes, profiles_app, subagents_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="statekeeper",
    help="Inspect and manage statekeeper sessions, runs, events, subagents and profiles.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(sessions.app, name="sessions")
app.add_typer(runs.app, name="runs")
app.command("gc")(gc)
app.add_typer(events_app, name="events")
app.add_typer(subagents_app, name="subagents")
app.command("lanes")(lanes)
app.add_typer(profiles_app, name="profiles")


@app.callback()
def _options(
    ctx: typer.Context,
    store: Annotated[
        str,
        typer.Option(
            "--store",
            envvar="STATEKEEPER_STORE",
            metavar="URL",
            help="Store URL: sqlite:///path.db, memory://, postgresql://... (see open_store).",
        ),
    ] = DEFAULT_STORE,
    tenant: Annotated[
        str,
        typer.Option(
            "--tenant", envvar="STATEKEEPER_TENANT", metavar="ID", help="Tenant (user) id."
        ),
    ] = DEFAULT_TENANT,
    json_output: Annotated[
        bool, typer.Option("--json", help="Machine-readable JSON output for list/show commands.")
    ] = False,
) -> None:
    """Inspect and manage statekeeper sessions and runs."""
    ctx.obj = Settings(store=store, tenant=tenant, json=json_output)


def main() -> None:
    """Entry point of the ``statekeeper`` console script."""
    app(prog_name="statekeeper")
