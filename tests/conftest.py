"""A ``store`` fixture for the feature suites (sessions, runs): every test runs on each
of `FEATURE_BACKENDS`, opened through the conformance registry (`statekeeper.testing`),
the same backends the conformance suite runs on. Backends that need a server skip when
it is missing, and fail under ``CI=true`` or ``STATEKEEPER_REQUIRE_SERVICES=1``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from statekeeper.stores import Store
from statekeeper.testing import open_backend

FEATURE_BACKENDS = ["memory", "sqlite", "files", "redis", "postgres"]
"""The conformance backends the feature suites run on (one per kind of storage)."""


@pytest.fixture(params=FEATURE_BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with open_backend(request.param, tmp_path) as opened:
        yield opened
