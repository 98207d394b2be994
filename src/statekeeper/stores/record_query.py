"""Optional record queries a backend may run itself instead of listing every record.

A caller (the long-term store) asks for them only when the store's class defines them
(`queryable`): a wrapping store (sealed, traced) passes attribute lookups through to the
store it wraps, but it may change what is stored (sealed values cannot be filtered in
SQL), so only the class's own methods count. Without them the caller lists records
and filters in Python, with the same results.

A `RecordQuery` is a *prefilter*: a store may keep records that fail its tests (the
caller re-checks each record it gets), but never drops one that passes them. Records
whose stored value is not JSON, or holds no object at ``within``, are always kept, so
the caller sees and reports them instead of their being skipped unseen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, TypeAlias

from statekeeper.stores.types import CorruptItem, RecordList

__all__ = [
    "KeyHeads",
    "Picked",
    "QueryableRecords",
    "RecordQuery",
    "RecordValues",
    "Scalar",
    "Stamp",
    "TestOp",
    "ValueTest",
    "key_heads",
    "queryable",
]

Scalar: TypeAlias = bool | int | float | str | None
TestOp: TypeAlias = Literal["eq", "ne", "in", "nin", "gt", "gte", "lt", "lte"]


@dataclass(frozen=True, slots=True)
class ValueTest:
    """A condition on the JSON found at ``path`` (object keys from ``within``).

    ``eq`` / ``ne``: JSON equality (``1 == 1.0``, ``true`` is not ``1``; a missing
    field is ``null``); ``in`` / ``nin`` take a tuple of operands; ``gt gte lt lte``
    order two numbers or two strings (by code point) and are false otherwise.
    """

    path: tuple[str, ...]
    op: TestOp
    operand: Scalar | tuple[Scalar, ...]


@dataclass(frozen=True, slots=True)
class RecordQuery:
    """Tests that must all hold on the part of a record's value at ``within``."""

    within: tuple[str, ...] = ()
    tests: tuple[ValueTest, ...] = ()


Stamp: TypeAlias = tuple[int, int]
"""Changes whenever a record is written (opaque: compare, do not read)."""


class Picked(NamedTuple):
    """A record's key, its `Stamp`, and the JSON at the picked path (None if absent)."""

    key: str
    stamp: Stamp
    value: Any


@dataclass(slots=True)
class RecordValues:
    """What `QueryableRecords.pick_record_values` returns: the picked values in key
    order, and the records it could not read (reported, not dropped)."""

    values: list[Picked] = field(default_factory=list)
    corrupt: list[CorruptItem] = field(default_factory=list)


class QueryableRecords(Protocol):
    """The record queries a backend may offer (see the module's docstring)."""

    async def query_records(
        self,
        tenant: str,
        namespace: str,
        query: RecordQuery,
        *,
        prefix: str = "",
        after_key: str | None = None,
        limit: int = 100,
    ) -> RecordList:
        """As ``list_records``, keeping only records the query may match."""
        ...

    async def pick_record_values(
        self, tenant: str, namespace: str, query: RecordQuery, path: tuple[str, ...], *, prefix: str
    ) -> RecordValues:
        """For every live record under ``prefix`` the query may match: its key and the
        JSON at ``path`` of its value (None when absent), without the rest."""
        ...

    async def list_record_stamps(
        self, tenant: str, namespace: str, query: RecordQuery, *, prefix: str
    ) -> list[tuple[str, Stamp]]:
        """(key, `Stamp`) of every live record under ``prefix`` the query may match, in
        key order, without their values: what a cache of them checks."""
        ...


class KeyHeads(Protocol):
    """Namespace-like listing a backend may offer on its own (see the module's docstring)."""

    async def list_key_heads(
        self, tenant: str, namespace: str, *, prefix: str, separator: str
    ) -> list[str]:
        """The distinct parts before ``separator`` of the keys of live records under
        ``prefix`` (keys without it are left out), sorted. Records that are not JSON do
        not count, as listings leave them out."""
        ...


_METHODS = ("query_records", "pick_record_values", "list_record_stamps")


def _defines(store: object, name: str) -> bool:
    return callable(getattr(type(store), name, None))


def queryable(store: object) -> QueryableRecords | None:
    """``store`` as `QueryableRecords` if its own class defines the queries, else None."""
    if all(_defines(store, name) for name in _METHODS):
        return store  # type: ignore[return-value]
    return None


def key_heads(store: object) -> KeyHeads | None:
    """``store`` as `KeyHeads` if its own class defines ``list_key_heads``, else None."""
    return store if _defines(store, "list_key_heads") else None  # type: ignore[return-value]
