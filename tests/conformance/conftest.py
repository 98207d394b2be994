"""Fixtures of the conformance suite: ``store`` runs a test once per registered backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Protocol

import pytest

from statekeeper.stores import Store

from .backends import BACKENDS, Backend, BackendContext


class StoreOpener(Protocol):
    """Opens another fresh store of the backend under test, with store options."""

    def __call__(self, **options: Any) -> Awaitable[Store]: ...


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "backend_bug(*backends, reason): a known bug; strict xfail on the named "
        "conformance backends only (use tests/conformance/backends.py:backend_bug)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Turn ``backend_bug`` marks into strict xfails on the backends they name."""
    for item in items:
        for mark in item.iter_markers("backend_bug"):
            unknown = set(mark.args) - set(BACKENDS)
            if unknown:
                raise pytest.UsageError(
                    f"{item.nodeid}: backend_bug names unknown backend(s) {sorted(unknown)}; "
                    f"registered: {sorted(BACKENDS)}"
                )
            callspec = getattr(item, "callspec", None)
            name = callspec.params.get("store_backend") if callspec is not None else None
            if name is None:
                raise pytest.UsageError(f"{item.nodeid}: backend_bug on a test without a store")
            if name in mark.args:
                reason = f"{name}: {mark.kwargs['reason']}"
                item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


@pytest.fixture(params=list(BACKENDS), ids=str)
def store_backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test (the test id names it)."""
    return BACKENDS[request.param]


@pytest.fixture
async def open_test_store(store_backend: Backend, tmp_path: Path) -> AsyncIterator[StoreOpener]:
    """Open further fresh stores of the backend under test, e.g. with a small size limit.

    Every store opened is closed and cleaned up at the end of the test.
    """
    async with AsyncExitStack() as stack:
        count = 0

        async def opener(**options: Any) -> Store:
            nonlocal count
            count += 1
            directory = tmp_path / f"store-{count}"
            directory.mkdir()
            ctx = BackendContext(
                name=store_backend.name,
                tmp_path=directory,
                unique=f"sk{uuid.uuid4().hex[:16]}",
                options=options,
            )
            return await stack.enter_async_context(store_backend.open(ctx))

        yield opener


@pytest.fixture
async def store(open_test_store: StoreOpener) -> Store:
    """A fresh, empty store of the backend under test."""
    return await open_test_store()
