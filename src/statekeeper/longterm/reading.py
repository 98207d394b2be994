"""How the long-term store reads many records: through the backend's own queries when it
has them (`statekeeper.stores.record_query`: filters and namespace listing in SQL),
else by listing records and deciding in Python, with the same results.

The Python rules (`statekeeper.longterm.rules`) stay the reference: a filter given to the
backend is only a prefilter, and every record it returns is checked again by
`rules.matches`. What cannot be put in a query (lists as values, operators on objects)
is left to that check, so a query never drops an item the rules would keep.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

from statekeeper.longterm import rules
from statekeeper.longterm.vectors import Unpacked, VectorCache
from statekeeper.stores.base import RecordStore, VersionedRecord
from statekeeper.stores.record_query import (
    KeyHeads,
    QueryableRecords,
    RecordQuery,
    Scalar,
    TestOp,
    ValueTest,
    key_heads,
    queryable,
)
from statekeeper.stores.types import CorruptItem

__all__ = ["PAGE", "Reader", "record_query", "report"]

_log = logging.getLogger("statekeeper.longterm")
PAGE: Final = 1000
"""The most records one listing call returns."""
_AFTER_ALL: Final = "\x7f"  # sorts after every character an id may hold
_SLOT_END: Final = ".:"  # ends a slot's namespace (see `rules.slot`)
_OPS: Final[dict[str, TestOp]] = {
    "$eq": "eq",
    "$ne": "ne",
    "$in": "in",
    "$nin": "nin",
    "$gt": "gt",
    "$gte": "gte",
    "$lt": "lt",
    "$lte": "lte",
}


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def record_query(filter: Mapping[str, Any]) -> RecordQuery:
    """The tests of a (checked) filter a backend can run, on the item's ``value``."""
    tests: list[ValueTest] = []
    _collect(filter, (), tests)
    return RecordQuery(within=("value",), tests=tuple(tests))


def _collect(filter: Mapping[str, Any], path: tuple[str, ...], tests: list[ValueTest]) -> None:
    for field, want in filter.items():
        here = (*path, field)
        if isinstance(want, dict) and any(str(k).startswith("$") for k in want):
            for op, operand in want.items():
                name = _OPS[op]
                if op in ("$in", "$nin"):
                    scalars: tuple[Scalar, ...] = tuple(o for o in operand if _is_scalar(o))
                    if op == "$nin" or len(scalars) == len(operand):  # fewer exclusions: fine
                        tests.append(ValueTest(here, name, scalars))
                elif _is_scalar(operand):
                    tests.append(ValueTest(here, name, operand))
        elif isinstance(want, dict):
            _collect(want, here, tests)
        elif _is_scalar(want):
            tests.append(ValueTest(here, "eq", want))
        # a list is matched item by item: left to `rules.matches`


def report(corrupt: list[CorruptItem]) -> None:
    """Log the records a backend could not decode (the rest are still served)."""
    for item in corrupt:
        _log.warning("skipping a long-term record: %s", item.error)


class Reader:
    """Reads the records of one tenant's record namespace, the fastest way its store can."""

    def __init__(self, store: RecordStore, tenant: str, namespace: str) -> None:
        self.store = store
        self.tenant = tenant
        self.namespace = namespace
        self.queries: QueryableRecords | None = queryable(store)
        self.heads: KeyHeads | None = key_heads(store)
        self.cache = None if self.queries is None else VectorCache(self.queries, tenant, namespace)

    async def records(
        self, scope: str, filter: Mapping[str, Any], *, first_page: int = PAGE
    ) -> AsyncIterator[VersionedRecord]:
        """The records under ``scope`` that may match ``filter``, in key order; pages
        start at ``first_page`` records and double (a search that needs ten reads ten)."""
        query = record_query(filter) if filter and self.queries is not None else None
        after: str | None = None
        size = max(1, min(first_page, PAGE))
        while True:
            if query is not None and self.queries is not None:
                page = await self.queries.query_records(
                    self.tenant, self.namespace, query, prefix=scope, after_key=after, limit=size
                )
            else:
                page = await self.store.list_records(
                    self.tenant, self.namespace, prefix=scope, after_key=after, limit=size
                )
            report(page.corrupt)  # first: a caller may stop at any record of the page
            for record in page:
                yield record
            if len(page) < size:
                return
            after = page[-1].key
            size = min(size * 2, PAGE)

    async def vectors(
        self, scope: str, filter: Mapping[str, Any]
    ) -> list[tuple[str, Unpacked]] | None:
        """(slot, vectors) of every record under ``scope`` that may match ``filter``,
        without reading the items (see `VectorCache`); None if the store cannot."""
        if self.cache is None:
            return None
        return await self.cache.vectors(scope, record_query(filter))

    async def namespaces(
        self, scope: str, keep: Callable[[tuple[str, ...]], tuple[str, ...] | None]
    ) -> set[tuple[str, ...]]:
        """The namespaces under ``scope`` that ``keep`` maps to (its value)."""
        if self.heads is not None:
            heads = await self.heads.list_key_heads(
                self.tenant, self.namespace, prefix=scope, separator=_SLOT_END
            )
            kept = (keep(tuple(head.split("."))) for head in heads)
            return {cut for cut in kept if cut is not None}
        return await self._walk_namespaces(scope, keep)

    async def _walk_namespaces(
        self, scope: str, keep: Callable[[tuple[str, ...]], tuple[str, ...] | None]
    ) -> set[tuple[str, ...]]:
        """As `namespaces`, by listing records and skipping from one namespace to the next.

        After a namespace, the scan jumps past the rest of its items (and past its whole
        subtree once ``keep`` cut it shorter), so it reads about one record per
        namespace, not every item. Pages start at 16 records and drop to 2 while pages
        hold mostly items of namespaces already seen (namespaces with many items).
        """
        seen: set[tuple[str, ...]] = set()
        after: str | None = None
        size = 16
        while True:
            page = await self.store.list_records(
                self.tenant, self.namespace, prefix=scope, after_key=after, limit=size
            )
            new = 0
            for record in page:
                if after is not None and record.key <= after:
                    continue  # inside a namespace or subtree already passed
                new += 1
                namespace = rules.slot_namespace(record.key)
                after = f"{rules.scope_prefix(namespace)}:{_AFTER_ALL}"  # past its own items
                cut = keep(namespace)
                if cut is not None:
                    seen.add(cut)
                    if len(cut) < len(namespace):  # its whole subtree yields the same cut
                        after = rules.scope_prefix(cut) + _AFTER_ALL
            if len(page) < size:
                return seen
            size = 16 if new * 2 >= len(page) else 2
