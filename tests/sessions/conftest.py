"""Fixtures for the sessions tests: every test runs on each embedded backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'state.db'}"
    opened = await open_store(url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def manager(store: Store) -> SessionManager:
    return SessionManager(store, "alice", agent_id="bot", max_messages=None)
