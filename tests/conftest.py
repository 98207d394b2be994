"""A ``store`` fixture for the feature suites (sessions, runs): every test runs on each
of `FEATURE_BACKENDS`, opened through the conformance registry (`statekeeper.testing`),
the same backends the conformance suite runs on. Backends that need a server skip when
it is missing, and fail under ``CI=true`` or ``STATEKEEPER_REQUIRE_SERVICES=1``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import settings

from statekeeper.stores import Store
from statekeeper.testing import open_backend

settings.register_profile("thorough", max_examples=1000)
"""``pytest --hypothesis-profile thorough`` (``make thorough``): ten times the examples of
the default profile for every property test without its own ``max_examples``."""

FEATURE_BACKENDS = ["memory", "sqlite", "files", "redis", "postgres"]
"""The conformance backends the feature suites run on (one per kind of storage)."""


@pytest.fixture(autouse=True)
def _no_inherited_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """CLI output is asserted as a pipe gets it: no ``COLUMNS``/``LINES`` from outside (an
    xdist worker has them, set when GNU readline is imported), or tables wrap at 80."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture(params=FEATURE_BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with open_backend(request.param, tmp_path) as opened:
        yield opened
