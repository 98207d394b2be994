"""The pytest plugin of the conformance suite: ``store`` fixtures, capabilities, known bugs.

Load it with ``-p statekeeper.testing.plugin`` (``validate`` does), with
``pytest_plugins = ["statekeeper.testing.plugin"]`` in a root ``conftest.py``, or by
importing its fixtures and hooks into a ``conftest.py``. Each test taking ``store`` then
runs once per backend: those a validation selected, those named with
``--statekeeper-backend`` (a root-level plugin only), or every registered one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

# Rewrite the spec's asserts (for detailed failure messages) also when a project imports
# its test modules instead of letting pytest collect them from the package.
pytest.register_assert_rewrite("statekeeper.testing.spec")

from statekeeper.stores import Store  # noqa: E402
from statekeeper.testing.registry import (  # noqa: E402
    BACKENDS,
    BASE,
    CAPABILITIES,
    PROCESSES,
    SHARED,
    Backend,
    BackendContext,
    new_context,
)

__all__ = [
    "CAPABILITY_PROPERTY",
    "SELECTED",
    "StoreOpener",
    "open_test_store",
    "other_handle",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_generate_tests",
    "store",
    "store_backend",
    "store_url",
]

SELECTED = pytest.StashKey[list[Backend]]()
"""The backends a run tests (set by ``validate``); else ``--statekeeper-backend`` or all."""
CAPABILITY_PROPERTY = "statekeeper_capability"
"""The user property naming the capability a test checks (`BASE`, or extended ones)."""
FIXTURE_NEEDS = {"other_handle": SHARED, "store_url": PROCESSES}
"""Fixtures whose use means a test checks an extended capability."""


class StoreOpener:
    """Opens further stores of the backend under test; closes them all at the end."""

    def __init__(self, backend: Backend, tmp_path: Path, stack: AsyncExitStack) -> None:
        self.backend = backend
        self._tmp_path = tmp_path
        self._stack = stack
        self._contexts: dict[int, BackendContext] = {}

    async def __call__(self, **options: Any) -> Store:
        """A fresh, empty store, opened with store ``options`` (e.g. max_payload_bytes)."""
        directory = self._tmp_path / f"store-{len(self._contexts) + 1}"
        directory.mkdir()
        ctx = new_context(self.backend, directory, **options)
        store = await self._stack.enter_async_context(self.backend.open(ctx))
        self._contexts[id(store)] = ctx
        return store

    async def another_handle(self, store: Store) -> Store:
        """A second handle on ``store``'s data, as another process would open it.

        Skips the test on backends without the `SHARED` capability.
        """
        _skip_unless(self.backend, SHARED)
        ctx = replace(self._contexts[id(store)], reopen=True)
        return await self._stack.enter_async_context(self.backend.open(ctx))

    def url_of(self, store: Store) -> str:
        """The URL another process opens ``store``'s data with (`PROCESSES` backends)."""
        _skip_unless(self.backend, PROCESSES)
        assert self.backend.url is not None  # a Backend with PROCESSES has one
        return self.backend.url(self._contexts[id(store)])


def _skip_unless(backend: Backend, capability: str) -> None:
    if not backend.has(capability):
        pytest.skip(_lacks(backend, capability))


def _lacks(backend: Backend, capability: str) -> str:
    return f"{backend.name} lacks the {capability!r} capability ({CAPABILITIES[capability]})"


def selected_backends(config: pytest.Config) -> list[Backend]:
    """The backends this run tests: chosen by ``validate``, or by the command line."""
    if SELECTED in config.stash:
        return config.stash[SELECTED]
    names: list[str] = config.getoption("statekeeper_backends", None) or list(BACKENDS)
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        raise pytest.UsageError(f"unknown backend(s) {unknown}; registered: {sorted(BACKENDS)}")
    return [BACKENDS[name] for name in names]


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--statekeeper-backend NAME``: run the store tests on these backends only."""
    parser.addoption(
        "--statekeeper-backend",
        dest="statekeeper_backends",
        action="append",
        metavar="NAME",
        help="run the conformance tests on this registered backend only (repeatable)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the suite's marks (runs with ``--strict-markers`` too)."""
    for line in (
        "backend_bug(*backends, reason): a known bug; strict xfail on the named backends "
        "only (use statekeeper.testing.backend_bug)",
        "needs_capability(*names): tests an extended capability; skipped on backends "
        "lacking it (use statekeeper.testing.needs)",
        "slow: longer tests (subprocesses, large histories)",
    ):
        config.addinivalue_line("markers", line)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each store test once per backend, with the backend's name as the test id."""
    if "store_backend" not in metafunc.fixturenames:
        return
    backends = selected_backends(metafunc.config)
    metafunc.parametrize("store_backend", backends, ids=[b.name for b in backends], indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Turn ``backend_bug`` marks into strict xfails and skip what a backend lacks."""
    known = {b.name for b in selected_backends(config)} | set(BACKENDS)
    for item in items:
        callspec = getattr(item, "callspec", None)
        chosen = callspec.params.get("store_backend") if callspec is not None else None
        _mark_known_bugs(item, chosen, known)
        if not isinstance(chosen, Backend):
            continue
        needed = _needed(item)
        item.user_properties.append((CAPABILITY_PROPERTY, "+".join(needed) or BASE))
        for capability in needed:
            if not chosen.has(capability):
                item.add_marker(pytest.mark.skip(reason=_lacks(chosen, capability)))
                break


def _mark_known_bugs(item: pytest.Item, chosen: object, known: set[str]) -> None:
    for mark in item.iter_markers("backend_bug"):
        unknown = set(mark.args) - known
        if unknown:
            raise pytest.UsageError(
                f"{item.nodeid}: backend_bug names unknown backend(s) {sorted(unknown)}; "
                f"registered: {sorted(known)}"
            )
        if not isinstance(chosen, Backend):
            raise pytest.UsageError(f"{item.nodeid}: backend_bug on a test without a store")
        if chosen.name in mark.args:
            reason = f"{chosen.name}: {mark.kwargs['reason']}"
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


def _needed(item: pytest.Item) -> list[str]:
    """The extended capabilities a test checks, from its marks and its fixtures."""
    needed = {c for mark in item.iter_markers("needs_capability") for c in mark.args}
    needed |= {c for f, c in FIXTURE_NEEDS.items() if f in getattr(item, "fixturenames", ())}
    return sorted(needed)


@pytest.fixture
def store_backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test (the test id names it)."""
    chosen: Backend = request.param
    return chosen


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


@pytest.fixture
def store_url(open_test_store: StoreOpener, store: Store) -> str:
    """The URL of ``store``'s data, for other processes (skips without `PROCESSES`)."""
    return open_test_store.url_of(store)
