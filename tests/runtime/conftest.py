"""Fixtures shared by the runtime tests: a fake clock and record stores (whole or sliced)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import Clock
from store_slices import RecordsOnly

from statekeeper.stores import open_store
from statekeeper.stores.base import RecordStore


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["memory", "sqlite", "records-only"])
async def record_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RecordStore]:
    """A store; "records-only" has nothing but a `RecordStore`'s methods (all it needs)."""
    url = f"sqlite:///{tmp_path / 's.db'}" if request.param == "sqlite" else "memory://"
    store = await open_store(url)
    try:
        yield RecordsOnly(store) if request.param == "records-only" else store
    finally:
        await store.close()
