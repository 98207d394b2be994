"""Fixtures of the conformance suite: ``store`` runs a test once per registered backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from statekeeper.stores import Store

from .backends import BACKENDS, SHARED, Backend, BackendContext


class StoreOpener:
    """Opens further stores of the backend under test; closes them all at the end."""

    def __init__(self, backend: Backend, tmp_path: Path, stack: AsyncExitStack) -> None:
        self._backend = backend
        self._tmp_path = tmp_path
        self._stack = stack
        self._contexts: dict[int, BackendContext] = {}

    async def __call__(self, **options: Any) -> Store:
        """A fresh, empty store, opened with store ``options`` (e.g. max_payload_bytes)."""
        directory = self._tmp_path / f"store-{len(self._contexts) + 1}"
        directory.mkdir()
        ctx = BackendContext(
            name=self._backend.name,
            tmp_path=directory,
            unique=f"sk{uuid.uuid4().hex[:16]}",
            options=options,
        )
        store = await self._stack.enter_async_context(self._backend.open(ctx))
        self._contexts[id(store)] = ctx
        return store

    async def another_handle(self, store: Store) -> Store:
        """A second handle on ``store``'s data, as another process would open it.

        Skips the test on backends without the `SHARED` capability.
        """
        if SHARED not in self._backend.capabilities:
            pytest.skip(f"{self._backend.name} cannot open two handles on the same data")
        ctx = replace(self._contexts[id(store)], reopen=True)
        return await self._stack.enter_async_context(self._backend.open(ctx))


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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each store test once per backend (only SHARED backends for ``other_handle``)."""
    if "store_backend" not in metafunc.fixturenames:
        return
    needs = {SHARED} if "other_handle" in metafunc.fixturenames else set()
    names = [name for name, b in BACKENDS.items() if needs <= b.capabilities]
    metafunc.parametrize("store_backend", names, ids=str, indirect=True)


@pytest.fixture
def store_backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test (the test id names it)."""
    return BACKENDS[request.param]


@pytest.fixture
async def open_test_store(store_backend: Backend, tmp_path: Path) -> AsyncIterator[StoreOpener]:
    """Open further stores of the backend under test (with options, or a second handle)."""
    async with AsyncExitStack() as stack:
        yield StoreOpener(store_backend, tmp_path, stack)


@pytest.fixture
async def store(open_test_store: StoreOpener) -> Store:
    """A fresh, empty store of the backend under test."""
    return await open_test_store()


@pytest.fixture
async def other_handle(open_test_store: StoreOpener, store: Store) -> Store:
    """A second handle on the data of ``store`` (skips on backends without `SHARED`)."""
    return await open_test_store.another_handle(store)
