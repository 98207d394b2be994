"""A ``sealed_store`` fixture: each test runs on every backend opened sealed (the
conformance registry's ``<name>-sealed`` backends), with the plain store it wraps at hand
as ``sealed_store.wrapped`` (what someone with access to the raw rows could do)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from statekeeper.stores.sealed import SealedStore
from statekeeper.testing import open_backend

SEALED_BACKENDS = [
    "memory-sealed",
    "sqlite-sealed",
    "files-sealed",
    "redis-sealed",
    "redis-cluster-sealed",
    "postgres-sealed",
]


@pytest.fixture(params=SEALED_BACKENDS)
async def sealed_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[SealedStore]:
    async with open_backend(request.param, tmp_path) as opened:
        assert isinstance(opened, SealedStore)
        yield opened
