"""Fixtures for the runs tests: each test runs on the memory and SQLite stores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from statekeeper.stores import Store, open_store


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'runs.db'}"
    opened = await open_store(url)
    try:
        yield opened
    finally:
        await opened.close()
