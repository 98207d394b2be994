"""The vectors a semantic search scores, held in memory and checked against the store.

A search asks the store for the key and `Stamp` (version and write time) of each
candidate record: no item is read or decoded for that. Vectors are read from the store
and unpacked only for records written since they were last held (another process's
writes included: a new write is a new stamp), so a repeated search costs the scoring
and a read of keys. Only what a backend with record queries offers
(`statekeeper.stores.record_query`) is held; other backends score items as they list
them.
"""

from __future__ import annotations

import logging
from array import array
from typing import Final, TypeAlias

from statekeeper.longterm import rules
from statekeeper.stores.record_query import (
    Picked,
    QueryableRecords,
    RecordQuery,
    RecordValues,
    Stamp,
)

__all__ = ["Unpacked", "VectorCache", "rank", "score", "unpack"]

_log = logging.getLogger("statekeeper.longterm")
_FEW: Final = 64  # missing vectors read one record at a time; more: all in one read
Unpacked: TypeAlias = "list[array[float]] | None"
"""An item's vectors, ready to score (None: it has none, or they cannot be read)."""


def unpack(where: str, vectors: object) -> Unpacked:
    """Stored vectors (base64 texts) unpacked; None, with a warning, if unreadable."""
    if vectors is None:
        return None
    try:
        if not isinstance(vectors, list):
            raise TypeError("not a list")
        return [rules.unpack_vector(v) for v in vectors]
    except (TypeError, ValueError):
        _log.warning("long-term record %s has unreadable vectors", where)
        return None


def score(probe: list[float], vectors: Unpacked) -> float | None:
    """The best similarity of an item's vectors to the query; None if none compares."""
    if not vectors:
        return None
    scores = [s for s in (rules.cosine(probe, v) for v in vectors) if s is not None]
    return max(scores) if scores else None


def rank(probe: list[float], found: list[tuple[str, Unpacked]]) -> list[tuple[float | None, str]]:
    """(score, key) of each item, most similar first, then those without a score, each
    group in the order given (`score` for one item; this loop is the search's hot path)."""
    cosine = rules.cosine
    scored: list[tuple[float, str]] = []
    unscored: list[tuple[float | None, str]] = []
    for key, vectors in found:
        best = cosine(probe, vectors[0]) if vectors and len(vectors) == 1 else score(probe, vectors)
        if best is None:
            unscored.append((None, key))
        else:
            scored.append((best, key))
    scored.sort(key=lambda pair: -pair[0])  # stable: equal scores keep the given order
    return [*scored, *unscored]


def report(values: RecordValues) -> list[Picked]:
    """The picked values, after logging the records that could not be read."""
    for item in values.corrupt:
        _log.warning("skipping a long-term record: %s", item.error)
    return values.values


class VectorCache:
    """Unpacked vectors of one record namespace, by record key, with the stamp read."""

    def __init__(self, queries: QueryableRecords, tenant: str, namespace: str) -> None:
        self.queries = queries
        self.tenant = tenant
        self.namespace = namespace
        self.limit = 16_000_000
        """The most numbers held (4 bytes each); past it the cache starts again."""
        self._held: dict[str, tuple[Stamp, Unpacked]] = {}
        self._numbers = 0

    async def vectors(self, scope: str, query: RecordQuery) -> list[tuple[str, Unpacked]]:
        """(key, vectors) of every live record under ``scope`` ``query`` may match."""
        stamps = await self.queries.list_record_stamps(
            self.tenant, self.namespace, query, prefix=scope
        )
        held = self._held
        missing = [key for key, stamp in stamps if held.get(key, (None,))[0] != stamp]
        if len(missing) > max(_FEW, len(stamps) // 8):
            picked = await self.queries.pick_record_values(
                self.tenant, self.namespace, query, ("vectors",), prefix=scope
            )
            return list(self._keep(report(picked)).items())
        lacking = set(missing)
        found = {key: held[key][1] for key, _ in stamps if key not in lacking}
        for key in missing:  # prefix=key: that record, and maybe some that extend its key
            picked = await self.queries.pick_record_values(
                self.tenant, self.namespace, RecordQuery(), ("vectors",), prefix=key
            )
            found |= self._keep([p for p in report(picked) if p.key == key])
        # a missing key not found since was deleted, expired or damaged (and reported)
        return [(key, found[key]) for key, _ in stamps if key in found]

    def _keep(self, picked: list[Picked]) -> dict[str, Unpacked]:
        """Unpack and hold ``picked``; return their vectors by key, in order."""
        kept = {}
        for key, stamp, value in picked:
            kept[key] = vectors = unpack(key, value)
            self._numbers += sum(map(len, vectors or ()))
            if self._numbers > self.limit:  # replaced vectors count until then: a bound
                self._held.clear()
                self._numbers = sum(map(len, vectors or ()))
            self._held[key] = (stamp, vectors)
        return kept
