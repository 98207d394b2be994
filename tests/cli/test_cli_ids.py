"""At 80 columns the CLI keeps every id whole: the other columns give way (issue 22)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_harness import Cli

from statekeeper.sessions import SessionManager
from statekeeper.stores import Store


async def _sessions(store: Store) -> list[str]:
    manager = SessionManager(store, "default")
    made = [
        await manager.create(title="A title long enough to want the room", agent_id="support")
        for _ in range(3)
    ]
    return [session.id for session in made]


def test_sessions_list_at_80_columns_shows_every_id_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    cli = Cli(f"sqlite:///{tmp_path / 'state.db'}")
    ids = cli.api(_sessions)
    assert len({i[:12] for i in ids}) == 1  # same prefix: cut ids would all look alike
    out = cli("sessions", "list").stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    for session_id in ids:
        assert session_id in out, out
