"""The ``statekeeper`` command line: a thin layer over the public API.

    statekeeper [--store URL] [--tenant ID] [--json] sessions list|show|fork|export|import|delete
    statekeeper ... runs list|show|approve|reject|resume|raise-limit|cancel|export|import
    statekeeper ... runs history|fork
    statekeeper ... gc --before DATE_OR_AGE [--dry-run]
    statekeeper ... events tail [--run ID] [--from SEQ] [--stream S ...] [--follow]
    statekeeper ... subagents list|kill|steer
    statekeeper ... lanes
    statekeeper ... profiles list|reset --agent AGENT
    statekeeper ... serve [--app MODULE:ATTR] [--host H] [--port P] [--dev-anonymous]
    statekeeper ... keys create --tenant T --scope read|operate|admin | list | revoke ID
    statekeeper ... reseal [--keyring env:VAR|file:PATH] [--namespace NAME ...] [--allow-plain]
                           [--check]

``--store`` defaults to ``$STATEKEEPER_STORE`` or ``sqlite:///.statekeeper/state.db``,
``--tenant`` to ``$STATEKEEPER_TENANT`` or ``default``. Expected failures print one red
``error: ...`` line and exit with code 1; usage errors exit with code 2.
Needs the ``cli`` extra (typer and rich); without it the command says so in one line.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from statekeeper.errors import MissingExtraError

if TYPE_CHECKING:
    from statekeeper.cli._app import app

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    # The app is imported on first use, so that importing this package (and `main`)
    # works without the ``cli`` extra.
    if name == "app":
        from statekeeper.cli._app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Entry point of the ``statekeeper`` console script."""
    try:
        from statekeeper.cli._app import app
    except MissingExtraError as exc:
        # One line, no traceback: the message says what to install (and rich, which
        # would colour it, may be the missing part).
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(1) from None
    app(prog_name="statekeeper")
