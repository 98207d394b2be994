"""`LongTermStore`: namespaced long-term memory over any statekeeper store.

Items live as versioned records of one record namespace (``ltm.<name>``) of one tenant;
the record key is the item's *slot* (`statekeeper.longterm.rules.slot`), so a search under
a namespace prefix is one key-range scan, and listing namespaces skips from namespace to
namespace instead of reading every item. Each record holds a JSON envelope
(`statekeeper.longterm.items`). Reads of many records go through
`statekeeper.longterm.reading` (filters and namespace listing run in the backend when it
can) and `statekeeper.longterm.vectors` (vectors held in memory for semantic search).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Final, TypeAlias

from pydantic import JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import encode_json
from statekeeper.longterm import rules
from statekeeper.longterm.items import (
    Found,
    MemoryItem,
    decode,
    decoded,
    envelope,
    stamp,
)
from statekeeper.longterm.reading import PAGE as _PAGE
from statekeeper.longterm.reading import Reader
from statekeeper.longterm.vectors import rank, score, unpack
from statekeeper.retry import retry_on_conflict
from statekeeper.stores.base import RecordStore, VersionedRecord

__all__ = ["DEFAULT_TTL", "EmbedFunc", "LongTermStore", "MemoryItem"]

EmbedFunc: TypeAlias = Callable[
    [Sequence[str]], Sequence[Sequence[float]] | Awaitable[Sequence[Sequence[float]]]
]
"""Texts in, one vector per text out; a plain or an ``async`` function."""

_log = logging.getLogger("statekeeper.longterm")
MAX_TTL: Final = 100 * 525_960.0
"""The longest TTL in minutes (100 years): an expiry must stay a real date."""


class _Default(Enum):
    TTL = "default"


DEFAULT_TTL: Final = _Default.TTL
"""``put(..., ttl=DEFAULT_TTL)`` (the default) uses the store's ``default_ttl``."""


def _check_ttl(ttl: object) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise InvalidInputError(f"ttl is minutes (a number > 0) or None, got {ttl!r}")
    if ttl <= 0:
        raise InvalidInputError(f"ttl must be more than 0 minutes, got {ttl}")
    if ttl > MAX_TTL:
        raise InvalidInputError(
            f"ttl is at most {MAX_TTL:.0f} minutes (100 years), got {ttl}; "
            "use ttl=None for an item that never expires"
        )
    return float(ttl)


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a whole number >= 0, got {value!r}")
    return value


class LongTermStore:
    """Namespaced long-term memory for one tenant, over any statekeeper store.

    ``embed`` turns texts into vectors (plain or async) and enables ``search(query=...)``;
    ``embed_query`` embeds the queries if they need another function (default: ``embed``).
    ``fields`` are the value paths embedded by default (``"$"`` is the whole value).
    ``default_ttl`` (minutes) applies to puts that do not give one; reads refresh an
    item's TTL unless ``refresh_on_read`` is False. ``clock`` is for tests.
    """

    def __init__(
        self,
        store: RecordStore,
        *,
        tenant: str,
        name: str = "default",
        embed: EmbedFunc | None = None,
        embed_query: EmbedFunc | None = None,
        fields: Sequence[str] = ("$",),
        dims: int | None = None,
        default_ttl: float | None = None,
        refresh_on_read: bool = True,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.tenant = validate_id(tenant, "tenant")
        self.namespace = validate_id(f"ltm.{validate_id(name, 'store name')}", "store name")
        self.embed = embed
        self.embed_query = embed_query or embed
        self.fields = tuple(fields)
        for path in self.fields:
            rules.texts_at({}, path)  # a bad path fails here, not at the first put
        if dims is not None:
            _check_count(dims, "dims")
        self.dims = dims
        self.default_ttl = _check_ttl(default_ttl)
        self.refresh_on_read = refresh_on_read
        self._clock = clock
        self._reader = Reader(store, self.tenant, self.namespace)

    # -- writes --------------------------------------------------------------------------

    async def put(
        self,
        namespace: Sequence[str],
        key: str,
        value: Mapping[str, JsonValue],
        *,
        index: bool | Sequence[str] | None = None,
        ttl: float | _Default | None = DEFAULT_TTL,
    ) -> MemoryItem:
        """Store ``value`` (a JSON object) at (namespace, key), replacing any item there.

        ``index``: None embeds the store's ``fields``, False nothing, a list those paths.
        ``ttl`` in minutes (None: never expires). ``created_at`` survives updates.
        """
        _, where, value, minutes = self._checked(namespace, key, value, ttl)
        vectors = await self._vectors(value, index)

        async def write() -> VersionedRecord:
            now = self._clock()
            created: str | None
            updated: str | None
            try:
                old = decode(await self.store.get_record(self.tenant, self.namespace, where))
                created, updated, version = stamp(old.created_at), stamp(now), old.record.version
            except NotFoundError:
                # New: its times are its record's, unless it has a TTL (a refresh rewrites
                # the record, so its times are written down).
                created = updated = None if minutes is None else stamp(now)
                version = 0
            held = envelope(where, key, value, created, updated, minutes, vectors)
            return await self.store.put_record(
                self.tenant,
                self.namespace,
                where,
                held,
                expected_version=version,
                expires_at=None if minutes is None else now + timedelta(minutes=minutes),
            )

        return decode(await retry_on_conflict(write, attempts=10)).item()

    def check_put(
        self,
        namespace: Sequence[str],
        key: str,
        value: Mapping[str, JsonValue],
        *,
        ttl: float | _Default | None = DEFAULT_TTL,
    ) -> None:
        """Raise what `put` would for this bad input, writing nothing: a caller with
        several puts checks them all first, so one bad item fails them all."""
        self._checked(namespace, key, value, ttl)

    def _checked(
        self, namespace: Sequence[str], key: str, value: object, ttl: object
    ) -> tuple[tuple[str, ...], str, dict[str, JsonValue], float | None]:
        ns = rules.check_namespace(namespace)
        where = rules.slot(ns, rules.check_key(key))
        if not isinstance(value, Mapping):
            raise InvalidInputError(
                f"a memory's value is a JSON object (dict), got {type(value).__name__}"
            )
        checked = dict(value)
        encode_json(checked, what=f"memory {'/'.join(ns)}/{key}")
        minutes = self.default_ttl if ttl is DEFAULT_TTL else _check_ttl(ttl)
        return ns, where, checked, minutes

    async def delete(self, namespace: Sequence[str], key: str) -> bool:
        """Delete the item; False if there was none."""
        where = rules.slot(rules.check_namespace(namespace), rules.check_key(key))
        try:
            await self.store.delete_record(self.tenant, self.namespace, where)
        except NotFoundError:
            return False
        return True

    # -- reads ---------------------------------------------------------------------------

    async def get(
        self, namespace: Sequence[str], key: str, *, refresh_ttl: bool | None = None
    ) -> MemoryItem | None:
        """The item, or None if absent or expired. Reading refreshes its TTL by default."""
        where = rules.slot(rules.check_namespace(namespace), rules.check_key(key))
        try:
            found = decode(await self.store.get_record(self.tenant, self.namespace, where))
        except NotFoundError:
            return None
        if self._refreshing(refresh_ttl):
            await self._refresh(found)
        return found.item()

    async def search(
        self,
        prefix: Sequence[str] = (),
        *,
        filter: Mapping[str, Any] | None = None,
        query: str | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool | None = None,
    ) -> list[MemoryItem]:
        """Items under the namespace ``prefix`` whose value matches ``filter``.

        Without ``query``, in namespace-then-key order. With ``query`` (needs ``embed``),
        by cosine similarity, most similar first (``score``), then items that have no
        vector. On a store with record queries (SQLite) the filter runs there and only
        the returned items are read; see `statekeeper.longterm.reading` and the docs.
        """
        ns = rules.check_namespace(prefix, empty=True)
        checked = rules.check_filter(filter or {})
        limit, offset = _check_count(limit, "limit"), _check_count(offset, "offset")
        if query is not None and self.embed is None:
            raise InvalidInputError(
                "search(query=...) needs an embedding function: LongTermStore(..., embed=fn)"
            )
        probe = None
        if query is not None:
            probe = rules.unit((await self._embed_texts([query], self.embed_query))[0])
        scope = rules.scope_prefix(ns)
        page: list[tuple[float | None, Found]]
        if probe is None:
            page = [(None, f) for f in await self._matching(scope, checked, offset + limit)]
            page = page[offset:]
        else:
            page = await self._ranked(scope, checked, probe, offset, limit)
        if self._refreshing(refresh_ttl):
            await asyncio.gather(*(self._refresh(f) for _, f in page))
        return [f.item(score) for score, f in page]

    async def _matching(
        self, scope: str, checked: dict[str, Any], count: int | None
    ) -> list[Found]:
        """The first ``count`` (None: all) items under ``scope`` matching the filter, in
        key order."""
        found: list[Found] = []
        first = _PAGE if count is None else count
        async for record in self._reader.records(scope, checked, first_page=first):
            candidate = decoded(record)
            if candidate is not None and rules.matches(candidate.envelope["value"], checked):
                found.append(candidate)
                if count is not None and len(found) >= count:
                    break
        return found

    async def _ranked(
        self, scope: str, checked: dict[str, Any], probe: list[float], offset: int, limit: int
    ) -> list[tuple[float | None, Found]]:
        """The page of items matching the filter, most similar first, then those without
        a vector. Scores come from the stored vectors alone when the store can read just
        them; only the items of the page are then read whole."""
        picked = await self._reader.vectors(scope, checked)
        if picked is None:  # the store lists whole records: score them all
            matching = await self._matching(scope, checked, None)
            scored = [(self._score(f, probe), f) for f in matching]
            scored.sort(key=lambda pair: (pair[0] is None, -(pair[0] or 0.0)))
            return scored[offset : offset + limit]
        ranked = rank(probe, picked)
        page: list[tuple[float | None, Found]] = []
        for _, where in ranked:
            if len(page) >= offset + limit:
                break
            try:
                found = decoded(await self.store.get_record(self.tenant, self.namespace, where))
            except NotFoundError:
                continue  # deleted or expired since
            if found is not None and rules.matches(found.envelope["value"], checked):
                page.append((self._score(found, probe), found))
        return page[offset:]

    async def list_namespaces(
        self,
        *,
        prefix: Sequence[str] = (),
        suffix: Sequence[str] = (),
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """The namespaces holding live items, sorted, matching ``prefix`` and ``suffix``
        (``"*"`` matches any one label), cut to ``max_depth`` labels and deduplicated."""
        want_prefix = rules.check_namespace(prefix, empty=True, wildcard=True)
        want_suffix = rules.check_namespace(suffix, empty=True, wildcard=True)
        if max_depth is not None and (_check_count(max_depth, "max_depth") < 1):
            raise InvalidInputError("max_depth must be at least 1 (or None for no cut)")
        limit, offset = _check_count(limit, "limit"), _check_count(offset, "offset")
        fixed = []
        for label in want_prefix:
            if label == "*":
                break
            fixed.append(label)

        def keep(namespace: tuple[str, ...]) -> tuple[str, ...] | None:
            if not rules.match_namespace(namespace, want_prefix, want_suffix):
                return None
            return namespace[:max_depth] if max_depth is not None else namespace

        found = await self._reader.namespaces(rules.scope_prefix(tuple(fixed)), keep)
        return sorted(found)[offset : offset + limit]

    # -- helpers -------------------------------------------------------------------------

    def _refreshing(self, refresh_ttl: bool | None) -> bool:
        return self.refresh_on_read if refresh_ttl is None else refresh_ttl

    async def _refresh(self, found: Found) -> None:
        """Push the expiry ``ttl`` minutes past now; a concurrent write wins (it set its own)."""
        minutes = found.envelope.get("ttl")
        if minutes is None:
            return
        record, value = found.record, found.envelope
        if "created_at" not in value:  # its times were the record's: keep them
            value = {**value, "created_at": stamp(found.created_at)}
        with contextlib.suppress(ConflictError, NotFoundError):
            found.record = await self.store.put_record(
                self.tenant,
                self.namespace,
                record.key,
                value,
                expected_version=record.version,
                expires_at=self._clock() + timedelta(minutes=minutes),
            )

    @staticmethod
    def _score(found: Found, probe: list[float]) -> float | None:
        """The best similarity of the item's vectors to the query (None: no vector)."""
        return score(probe, unpack(found.record.key, found.envelope.get("vectors")))

    async def _vectors(
        self, value: dict[str, JsonValue], index: bool | Sequence[str] | None
    ) -> list[str]:
        if index is False or (index is None and self.embed is None):
            return []
        if self.embed is None:
            raise InvalidInputError(
                "put(index=[...]) needs an embedding function: LongTermStore(..., embed=fn)"
            )
        if index is True or index is None:
            paths: Sequence[str] = self.fields
        elif isinstance(index, str) or not isinstance(index, Sequence):
            raise InvalidInputError(f"index is None, False or a list of field paths, got {index!r}")
        else:
            paths = index
        texts = [text for path in paths for text in rules.texts_at(value, path)]
        if not texts:
            return []
        return [rules.pack_vector(v) for v in await self._embed_texts(texts, self.embed)]

    async def _embed_texts(self, texts: list[str], embed: EmbedFunc | None) -> list[list[float]]:
        assert embed is not None
        result = embed(texts)
        if inspect.isawaitable(result):
            result = await result
        vectors = [list(v) for v in result]
        if len(vectors) != len(texts):
            raise InvalidInputError(
                f"the embedding function returned {len(vectors)} vectors for {len(texts)} texts"
            )
        for vector in vectors:
            if self.dims is not None and len(vector) != self.dims:
                raise InvalidInputError(
                    f"the embedding function returned {len(vector)} numbers, not dims={self.dims}"
                )
            if not all(isinstance(x, int | float) and math.isfinite(x) for x in vector):
                raise InvalidInputError("the embedding function returned a non-finite number")
        return vectors
