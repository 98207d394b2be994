"""Run the shipped conformance suite against one backend and report what it found."""

from __future__ import annotations

import importlib
import io
from collections.abc import Iterable
from contextlib import asynccontextmanager, redirect_stdout
from dataclasses import replace
from pathlib import Path

from statekeeper.errors import MissingExtraError
from statekeeper.testing.registry import BACKENDS, Backend, Factory, url_backend
from statekeeper.testing.report import Collector, Report

__all__ = ["resolve", "validate"]

SPEC = Path(__file__).resolve().parent / "spec"
"""The suite's test modules, and the pytest.ini they run with (it loads the plugin)."""


def resolve(
    target: str | Backend | Factory,
    *,
    capabilities: Iterable[str] | None = None,
    imports: Iterable[str] = (),
) -> Backend:
    """The backend ``target`` names: a store URL, a registered name, a `Backend`, or an
    async generator function yielding fresh stores (as the ``backend`` decorator takes).

    ``capabilities`` replaces the extended capabilities it declares.
    """
    modules = tuple(imports)
    if isinstance(target, Backend):
        chosen = target
    elif isinstance(target, str) and "://" in target:
        scheme = target.split("://", 1)[0]
        chosen = url_backend(scheme, target, imports=modules, register=False)
    elif isinstance(target, str):
        if target not in BACKENDS:
            raise ValueError(f"no backend named {target!r}; registered: {sorted(BACKENDS)}")
        chosen = BACKENDS[target]
    else:
        chosen = Backend(target.__name__, asynccontextmanager(target))
    if capabilities is not None:
        chosen = replace(chosen, capabilities=frozenset(capabilities))
    if modules and not chosen.imports:
        chosen = replace(chosen, imports=modules)
    return chosen


def validate(
    target: str | Backend | Factory,
    *,
    capabilities: Iterable[str] | None = None,
    imports: Iterable[str] = (),
    keyword: str | None = None,
    show_output: bool = False,
) -> Report:
    """Run the conformance suite against one backend and return the `Report`.

    ``target`` is a store URL (``"sqlite:///state.db"``: each test gets a fresh store
    derived from it, see `register_scheme`), a registered backend name, a `Backend`, or
    a factory. ``imports`` are modules to import first (ones that register a backend or
    a URL scheme; other processes import them too). ``keyword`` selects tests like
    ``pytest -k``; ``show_output`` lets pytest print its own progress and tracebacks.

    Runs pytest in this process, so call it from synchronous code (not from inside a
    running event loop). Needs the ``testing`` extra.
    """
    modules = tuple(imports)
    for module in modules:
        importlib.import_module(module)
    chosen = resolve(target, capabilities=capabilities, imports=modules)
    try:
        import hypothesis  # noqa: F401  (the spec needs it: fail here, with the fix)
        import pytest
        import pytest_asyncio  # noqa: F401
    except ImportError:
        raise MissingExtraError("validating a store", "testing") from None

    args = [
        str(SPEC),
        *("-c", str(SPEC / "pytest.ini"), "--rootdir", str(SPEC)),
        *("-p", "no:cacheprovider", "-q"),
        *(("-k", keyword) if keyword else ()),
    ]
    collector = Collector(chosen, target if isinstance(target, str) else chosen.name)
    output = io.StringIO()
    if show_output:
        code = pytest.main(args, plugins=[collector])
    else:
        with redirect_stdout(output):
            code = pytest.main(args, plugins=[collector])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        tail = "\n".join(output.getvalue().strip().splitlines()[-20:])
        collector.report.errors.append(f"pytest stopped ({code!s}) {tail}".rstrip())
    return collector.report
