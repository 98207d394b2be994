"""Shared helpers of the conformance tests: ids, drafts, JSON strategies and comparisons."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from statekeeper.stores import Store
from statekeeper.stores.base import EntryDraft, SessionQuery, SessionRecord

TENANT = "tenant-a"
OTHER_TENANT = "tenant-b"
ALL_BACKENDS = ("memory", "sqlite", "sqlite-worker", "sqlite-process")
"""The built-in backends, in registration order."""
SQLITE = ("sqlite", "sqlite-worker", "sqlite-process")
"""The built-in SQLite backends (for `backend_bug` marks on all of them)."""

T0 = datetime(2030, 1, 1, tzinfo=UTC)
"""A fixed instant for tests that need exact, distinct timestamps."""

_counter = itertools.count(1)


def fresh_id(prefix: str) -> str:
    """A new valid id, unique within the test run (for hypothesis examples)."""
    return f"{prefix}-{next(_counter)}"


def at(seconds: float) -> datetime:
    """``T0`` plus some seconds."""
    return T0 + timedelta(seconds=seconds)


def draft(entry_id: str, parent: Any = "head", **payload: Any) -> EntryDraft:
    """An entry draft with a small payload naming it."""
    return EntryDraft(id=entry_id, parent=parent, payload={"text": entry_id, **payload})


async def new_session(
    store: Store, session_id: str, tenant: str = TENANT, **fields: Any
) -> SessionRecord:
    """Create a session and return what the store returned."""
    return await store.create_session(SessionRecord(id=session_id, tenant=tenant, **fields))


async def seqs_of(store: Store, session_id: str, tenant: str = TENANT) -> list[int]:
    return [e.seq for e in await store.read_entries(tenant, session_id)]


async def walk(store: Store, tenant: str, **query: Any) -> list[list[str]]:
    """Follow next_cursor from the first page to the last; the ids of each page."""
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = await store.list_sessions(tenant, SessionQuery(cursor=cursor, **query))
        pages.append([s.id for s in page.items])
        cursor = page.next_cursor
        if cursor is None:
            return pages
        assert len(pages) < 50, "paging does not end"


async def make_sessions(store: Store, stamps: Mapping[str, float]) -> list[SessionRecord]:
    """Sessions named by the keys, last active at ``at(value)``, as the store has them."""
    for session_id, seconds in stamps.items():
        await new_session(store, session_id, last_active=at(seconds))
    return [await store.get_session(TENANT, session_id) for session_id in stamps]


# -- JSON ---------------------------------------------------------------------------------

# Strings without lone surrogates (those are not valid Unicode; see the dedicated tests).
json_text = st.text(st.characters(codec="utf-8"), max_size=12)
json_exact_scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**100), max_value=2**100) | json_text
)
"""JSON scalars other than floats (whose text form varies between encoders)."""
json_scalars = json_exact_scalars | st.floats(allow_nan=False, allow_infinity=False)


def json_trees(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """JSON values (nested lists and objects) built from ``scalars``."""
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(json_text, children, max_size=4)
        ),
        max_leaves=12,
    )


json_values = json_trees(json_scalars)
json_objects = st.dictionaries(json_text, json_values, max_size=5)

hypothesis_settings = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
"""For @given tests taking the ``store`` fixture: one store serves every example, so each
example works on fresh ids (`fresh_id`) instead of a fresh store."""


def assert_same_json(actual: Any, expected: Any, path: str = "$") -> None:
    """Assert two JSON values are identical, types included (1 vs 1.0 vs True, -0.0)."""
    assert type(actual) is type(expected), f"{path}: {actual!r} is not {expected!r}"
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), f"{path}: keys {actual.keys()} != {expected}"
        for key in expected:
            assert_same_json(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{path}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same_json(a, e, f"{path}[{i}]")
    elif isinstance(expected, float):
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
        assert math.copysign(1, actual) == math.copysign(1, expected), f"{path}: sign of zero"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


SAMPLE_PAYLOAD: dict[str, Any] = {
    "text": "héllo wörld — 你好 — 🙂",
    "nul": "a\x00b",
    "controls": "\n\t\r\x1f\x7f\u2028",
    "quotes": "\"'\\/",
    "big": 2**70,
    "negative_big": -(2**70),
    "int": 7,
    "floats": [0.1, 1.0, -0.0, 1e308, 5e-324, -2.5e-7, 1e16],
    "flags": [True, False, None],
    "nested": {"a": [{"b": {"c": []}}, {}], "": "empty key", "ключ": "значение"},
}
"""A payload exercising the JSON corners every backend must keep exactly."""
