"""`LongTermStore`: namespaced long-term memory over any statekeeper store.

Items live as versioned records of one record namespace (``ltm.<name>``) of one tenant;
the record key is the item's *slot* (`statekeeper.longterm.rules.slot`), so a search under
a namespace prefix is one key-range scan, and listing namespaces skips from namespace to
namespace instead of reading every item. Each record holds a JSON envelope: the value,
created / updated times, the TTL and, when indexed, unit-length float32 vectors as base64.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Final, TypeAlias

from pydantic import JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    StoreCorruptError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import encode_json
from statekeeper.longterm import rules
from statekeeper.retry import retry_on_conflict
from statekeeper.stores.base import RecordStore, VersionedRecord

__all__ = ["DEFAULT_TTL", "EmbedFunc", "LongTermStore", "MemoryItem"]

EmbedFunc: TypeAlias = Callable[
    [Sequence[str]], Sequence[Sequence[float]] | Awaitable[Sequence[Sequence[float]]]
]
"""Texts in, one vector per text out; a plain or an ``async`` function."""

_log = logging.getLogger("statekeeper.longterm")
_PAGE: Final = 1000
_AFTER_ALL: Final = "\x7f"  # sorts after every character an id may hold
MAX_TTL: Final = 100 * 525_960.0
"""The longest TTL in minutes (100 years): an expiry must stay a real date."""


class _Default(Enum):
    TTL = "default"


DEFAULT_TTL: Final = _Default.TTL
"""``put(..., ttl=DEFAULT_TTL)`` (the default) uses the store's ``default_ttl``."""


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """A stored item; ``score`` is the similarity to a search query (None otherwise)."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, JsonValue]
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    score: float | None = None


@dataclass(slots=True)
class _Found:
    record: VersionedRecord
    envelope: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    def item(self, score: float | None = None) -> MemoryItem:
        return MemoryItem(
            rules.slot_namespace(self.record.key),
            self.envelope["key"],
            self.envelope["value"],
            self.created_at,
            self.updated_at,
            self.record.expires_at,
            score,
        )


def _decode(record: VersionedRecord) -> _Found:
    """The item a record holds; `StoreCorruptError` if it is not an item envelope.

    Cheap on purpose (a search decodes every record under its prefix): the namespace is
    read from the record key, and vectors are checked when a query scores them.
    """
    env: Any = record.value
    try:
        if not isinstance(env, dict):
            raise TypeError("not an object")
        if not isinstance(env["value"], dict) or not isinstance(env["key"], str):
            raise TypeError("no value or key")
        created = datetime.fromisoformat(env["created_at"])
        updated = datetime.fromisoformat(env["updated_at"])
        ttl = env.get("ttl")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)):
            raise TypeError("bad ttl")
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreCorruptError(
            f"long-term record {record.namespace}/{record.key} is not an item envelope "
            f"({exc}); delete or rewrite it"
        ) from exc
    return _Found(record, env, created, updated)


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
        ns, where, value, minutes = self._checked(namespace, key, value, ttl)
        vectors = await self._vectors(value, index)

        async def write() -> VersionedRecord:
            now = self._clock()
            try:
                old = _decode(await self.store.get_record(self.tenant, self.namespace, where))
                created, version = old.created_at.isoformat(), old.record.version
            except NotFoundError:
                created, version = now.isoformat(), 0
            envelope: dict[str, JsonValue] = {
                "namespace": list(ns),
                "key": key,
                "value": value,
                "created_at": created,
                "updated_at": now.isoformat(),
                "ttl": minutes,
            }
            if vectors:
                envelope["vectors"] = list[JsonValue](vectors)
            return await self.store.put_record(
                self.tenant,
                self.namespace,
                where,
                envelope,
                expected_version=version,
                expires_at=None if minutes is None else now + timedelta(minutes=minutes),
            )

        return _decode(await retry_on_conflict(write, attempts=10)).item()

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
            found = _decode(await self.store.get_record(self.tenant, self.namespace, where))
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
        vector. Every item under the prefix is read: see the docs for the scale.
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
        found: list[_Found] = []
        async for candidate in self._scan(rules.scope_prefix(ns)):
            if rules.matches(candidate.envelope["value"], checked):
                found.append(candidate)
                if probe is None and len(found) >= offset + limit:
                    break
        scored = [(self._score(f, probe), f) for f in found]
        if probe is not None:  # stable: equal scores keep namespace-then-key order
            scored.sort(key=lambda pair: (pair[0] is None, -(pair[0] or 0.0)))
        page = scored[offset : offset + limit]
        if self._refreshing(refresh_ttl):
            await asyncio.gather(*(self._refresh(f) for _, f in page))
        return [f.item(score) for score, f in page]

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

        found = await self._walk_namespaces(rules.scope_prefix(tuple(fixed)), keep)
        return sorted(found)[offset : offset + limit]

    async def _walk_namespaces(
        self, scope: str, keep: Callable[[tuple[str, ...]], tuple[str, ...] | None]
    ) -> set[tuple[str, ...]]:
        """The namespaces ``keep`` maps to, skipping from one namespace to the next.

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

    # -- helpers -------------------------------------------------------------------------

    def _refreshing(self, refresh_ttl: bool | None) -> bool:
        return self.refresh_on_read if refresh_ttl is None else refresh_ttl

    async def _refresh(self, found: _Found) -> None:
        """Push the expiry ``ttl`` minutes past now; a concurrent write wins (it set its own)."""
        minutes = found.envelope.get("ttl")
        if minutes is None:
            return
        record = found.record
        with contextlib.suppress(ConflictError, NotFoundError):
            found.record = await self.store.put_record(
                self.tenant,
                self.namespace,
                record.key,
                record.value,
                expected_version=record.version,
                expires_at=self._clock() + timedelta(minutes=minutes),
            )

    async def _scan(self, scope: str) -> AsyncIterator[_Found]:
        after: str | None = None
        while True:
            page = await self.store.list_records(
                self.tenant, self.namespace, prefix=scope, after_key=after, limit=_PAGE
            )
            for record in page:
                try:
                    yield _decode(record)
                except StoreCorruptError as exc:  # reported and isolated, the rest served
                    _log.warning("skipping a long-term record: %s", exc)
            for item in page.corrupt:  # rows the store itself could not decode
                _log.warning("skipping a long-term record: %s", item.error)
            if len(page) < _PAGE:
                return
            after = page[-1].key

    @staticmethod
    def _score(found: _Found, probe: list[float] | None) -> float | None:
        """The best similarity of the item's vectors to the query (None: no vector)."""
        if probe is None:
            return None
        try:
            vectors = [rules.unpack_vector(v) for v in found.envelope.get("vectors", [])]
        except (TypeError, ValueError):
            _log.warning("long-term record %s has unreadable vectors", found.record.key)
            return None
        scores = [s for s in (rules.cosine(probe, v) for v in vectors) if s is not None]
        return max(scores) if scores else None

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
