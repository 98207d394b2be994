"""Fixtures for the sessions tests (``store`` comes from tests/conftest.py)."""

from __future__ import annotations

import pytest

from statekeeper.sessions import SessionManager
from statekeeper.stores import Store


@pytest.fixture
def manager(store: Store) -> SessionManager:
    return SessionManager(store, "alice", agent_id="bot", max_messages=None)
