"""CLI surfaces a new user trips on (issue 11): reading a store that is not there,
importing a duplicate, and how a fork's view numbers its entries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import pytest
from cli_harness import Cli
from typer.testing import CliRunner

from statekeeper.cli import app
from statekeeper.core.messages import Message
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

T = TypeVar("T")


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("sessions", "list"),
        ("sessions", "show", "ses-a"),
        ("sessions", "export", "ses-a"),
        ("runs", "list"),
        ("runs", "show", "run-a"),
        ("sessions", "delete", "ses-a", "--yes"),
    ],
)
@pytest.mark.parametrize("scheme", ["sqlite", "files"])
def test_commands_on_a_missing_store_create_nothing(
    tmp_path: Path, command: tuple[str, ...], scheme: str
) -> None:
    where = tmp_path / "typo" / ("state.db" if scheme == "sqlite" else "store")
    url = f"{scheme}:///{where}"
    code, stdout, stderr = invoke("--store", url, *command)
    assert code == 1
    assert stdout == ""
    assert stderr.startswith("error: ")
    assert "does not exist" in stderr
    assert "--store" in stderr
    assert not (tmp_path / "typo").exists()


def test_read_commands_open_sqlite_read_only(tmp_path: Path) -> None:
    cli = Cli(f"sqlite:///{tmp_path / 'state.db'}")
    cli.api(lambda store: SessionManager(store, "default").create(session_id="ses-a"))
    before = (tmp_path / "state.db").read_bytes()
    (tmp_path / "state.db").chmod(0o444)
    try:
        assert [s["id"] for s in cli.json("sessions", "list")["items"]] == ["ses-a"]
        cli("sessions", "show", "ses-a")
        cli("runs", "list")
    finally:
        (tmp_path / "state.db").chmod(0o644)
    assert (tmp_path / "state.db").read_bytes() == before


def test_import_creates_a_missing_store(tmp_path: Path) -> None:
    source = Cli(f"sqlite:///{tmp_path / 'a.db'}")
    source.api(
        lambda store: SessionManager(store, "default").create(
            session_id="ses-a", messages=[Message.user("hi")]
        )
    )
    exported = tmp_path / "ses-a.json"
    source("sessions", "export", "ses-a", "-o", str(exported))
    target = Cli(f"sqlite:///{tmp_path / 'new' / 'b.db'}")
    target("sessions", "import", str(exported))
    assert [s["id"] for s in target.json("sessions", "list")["items"]] == ["ses-a"]


def test_importing_a_duplicate_suggests_id(tmp_path: Path) -> None:
    cli = Cli(f"sqlite:///{tmp_path / 'state.db'}")
    cli.api(
        lambda store: SessionManager(store, "default").create(
            session_id="ses-a", messages=[Message.user("hi")]
        )
    )
    exported = tmp_path / "ses-a.json"
    cli("sessions", "export", "ses-a", "-o", str(exported))
    result = cli("sessions", "import", str(exported), code=1)
    assert "--id" in result.stderr
    assert "ses-a" in result.stderr
    cli("sessions", "import", str(exported), "--id", "ses-a2")


def test_a_forks_view_keeps_the_entries_own_numbers(tmp_path: Path) -> None:
    cli = Cli(f"sqlite:///{tmp_path / 'state.db'}")

    async def seed(store: Store) -> None:
        manager = SessionManager(store, "default")
        chat = await manager.create(
            session_id="orig",
            messages=[Message.system("sys"), Message.user("u1"), Message.assistant("a1")],
        )
        await chat.append(Message.user("u2"))
        fork = await chat.fork(at=3, session_id="frk")
        await fork.append(Message.user("fork-u"))

    cli.api(seed)
    shown = cli.json("sessions", "show", "frk")
    rows = [(m["session_id"], m["seq"], m["content"]) for m in shown["messages"]]
    assert rows == [
        ("orig", 1, "sys"),
        ("orig", 2, "u1"),
        ("orig", 3, "a1"),
        ("frk", 1, "fork-u"),
    ]
    table = cli("sessions", "show", "frk").stdout
    assert "orig@3" in table
    assert json.dumps(shown)  # plain JSON
