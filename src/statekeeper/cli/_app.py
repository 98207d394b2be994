"""The typer app: the global options and every command group.

Kept apart from `statekeeper.cli` so that the package imports without the ``cli`` extra
and `statekeeper.cli.main` can report a missing extra in one line.
"""

from __future__ import annotations

from typing import Annotated

try:
    import rich  # noqa: F401  (every command prints with it)
    import typer
except ImportError as exc:
    from statekeeper.errors import MissingExtraError

    raise MissingExtraError("the statekeeper command line", "cli") from exc

from statekeeper.cli import runs, sessions, timetravel
from statekeeper.cli._common import DEFAULT_STORE, DEFAULT_TENANT, Settings
from statekeeper.cli.events import events_app
from statekeeper.cli.profiles import profiles_app
from statekeeper.cli.reseal import reseal_command
from statekeeper.cli.retention import gc
from statekeeper.cli.runlimits import raise_limit
from statekeeper.cli.runtime import lanes, subagents_app
from statekeeper.cli.server import keys_app, serve
from statekeeper.cli.steer import followup, start

__all__ = ["app"]

app = typer.Typer(
    name="statekeeper",
    help="Inspect and manage statekeeper sessions, runs, events, subagents and profiles;\n"
    "serve them over HTTP (serve, keys).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    # Plain (click-style) help: typer's rich help labels every flag `<bool>`, as if it
    # took a value. Plain help also rewraps each paragraph of a docstring by itself.
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)
app.add_typer(sessions.app, name="sessions")
runs.app.command("raise-limit")(raise_limit)
runs.app.command("history")(timetravel.history)
runs.app.command("fork")(timetravel.fork)
runs.app.command("start")(start)
runs.app.command("followup")(followup)
app.add_typer(runs.app, name="runs")
app.command("gc")(gc)
app.add_typer(events_app, name="events")
app.add_typer(subagents_app, name="subagents")
app.command("lanes")(lanes)
app.add_typer(profiles_app, name="profiles")
app.command("serve")(serve)
app.add_typer(keys_app, name="keys")
app.command("reseal")(reseal_command)


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
