"""Damage what a store keeps, below its API: for tests of how damaged rows are reported.

`damage_session` overwrites a session's stored head, `damage_record` a record's stored
value, with the given text (invalid JSON by default), the way a disk fault, a bad
migration or another program writing to the same database would. Nothing else changes
(the SQL backends also move the row's version on, so a head a handle cached is not used
in place of the damaged one). The files store's head loses its backup too, so the damage
cannot be repaired from it.

The built-in durable backends can be damaged; the memory store keeps live objects, so
nothing it stores can be: `can_damage` says which. Another backend joins with
`register_damager`::

    register_damager("mypkg.store.MyStore", MyDamager())
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any, Protocol

from statekeeper.errors import NotFoundError
from statekeeper.ids import validate_id
from statekeeper.stores import Store

__all__ = [
    "NOT_JSON",
    "Damager",
    "can_damage",
    "damage_record",
    "damage_session",
    "register_damager",
]

NOT_JSON = '{"id": "cut off'
"""What the helpers write by default: a head or value cut off mid-string."""


class Damager(Protocol):
    """Writes raw text in place of a stored session head or record value of one backend."""

    async def session(self, store: Any, tenant: str, session_id: str, raw: str) -> None:
        """Replace the stored head of a session; `NotFoundError` if there is none."""
        ...

    async def record(self, store: Any, tenant: str, namespace: str, key: str, raw: str) -> None:
        """Replace the stored value of a record; `NotFoundError` if there is none."""
        ...


DAMAGERS: dict[str, Damager] = {}
"""``module.Class`` of a store -> how to damage it."""


def register_damager(store_class: str, damager: Damager) -> None:
    """Let the helpers damage stores of ``store_class`` (``"module.Class"``) and its subclasses."""
    DAMAGERS[store_class] = damager


def _damager(store: Store) -> Damager | None:
    store = _unwrapped(store)
    for cls in type(store).__mro__:
        found = DAMAGERS.get(f"{cls.__module__}.{cls.__qualname__}")
        if found is not None:
            return found
    return None


def _unwrapped(store: Any) -> Any:
    """The backend under wrappers (a sealed or traced store keeps it as ``wrapped``)."""
    while hasattr(store, "wrapped"):
        store = store.wrapped
    return store


def can_damage(store: Store) -> bool:
    """Whether the helpers know how to damage what ``store`` keeps."""
    return _damager(store) is not None


def _require(store: Store) -> Damager:
    found = _damager(store)
    if found is None:
        raise TypeError(
            f"cannot damage the data of {type(store).__name__}: register a Damager for it "
            "with statekeeper.testing.damage.register_damager"
        )
    return found


async def damage_session(store: Store, tenant: str, session_id: str, raw: str = NOT_JSON) -> None:
    """Overwrite the stored head of a session with ``raw``."""
    validate_id(tenant, "tenant")
    validate_id(session_id, "session id")
    await _require(store).session(_unwrapped(store), tenant, session_id, raw)


async def damage_record(
    store: Store, tenant: str, namespace: str, key: str, raw: str = NOT_JSON
) -> None:
    """Overwrite the stored value of a record with ``raw``."""
    for value, what in ((tenant, "tenant"), (namespace, "namespace"), (key, "record key")):
        validate_id(value, what)
    await _require(store).record(_unwrapped(store), tenant, namespace, key, raw)


def _missing(what: str) -> NotFoundError:
    return NotFoundError(f"{what} is not stored: nothing to damage")


# -- the built-in backends ----------------------------------------------------------------


class _SQLite:
    """A second connection to the database file, as another program would open it."""

    @staticmethod
    def _update(path: str, sql: str, params: tuple[Any, ...], what: str) -> None:
        conn = sqlite3.connect(path, timeout=30)
        try:
            with conn:
                if conn.execute(sql, params).rowcount != 1:
                    raise _missing(what)
        finally:
            conn.close()

    async def session(self, store: Any, tenant: str, session_id: str, raw: str) -> None:
        sql = "UPDATE sessions SET doc=?, version=version+1 WHERE tenant=? AND id=?"
        args = (str(store.path), sql, (raw, tenant, session_id), f"session {session_id!r}")
        await asyncio.to_thread(self._update, *args)

    async def record(self, store: Any, tenant: str, namespace: str, key: str, raw: str) -> None:
        sql = "UPDATE records SET value=? WHERE tenant=? AND namespace=? AND key=?"
        args = (str(store.path), sql, (raw, tenant, namespace, key), f"record {namespace}/{key}")
        await asyncio.to_thread(self._update, *args)


class _Postgres:
    """A statement on one of the store's own connections."""

    @staticmethod
    async def _update(store: Any, statement: str, params: tuple[Any, ...], what: str) -> None:
        from psycopg import sql

        query = sql.SQL(statement).format(sql.Identifier(store.schema))

        async def run(conn: Any) -> None:
            cur = await conn.execute(query, params)
            if cur.rowcount != 1:
                raise _missing(what)

        await store._write(run)

    async def session(self, store: Any, tenant: str, session_id: str, raw: str) -> None:
        statement = (
            "UPDATE {}.sessions SET doc = %s, version = version + 1 WHERE tenant = %s AND id = %s"
        )
        await self._update(store, statement, (raw, tenant, session_id), f"session {session_id!r}")

    async def record(self, store: Any, tenant: str, namespace: str, key: str, raw: str) -> None:
        statement = (
            "UPDATE {}.records SET value = %s WHERE tenant = %s AND namespace = %s AND key = %s"
        )
        params = (raw, tenant, namespace, key)
        await self._update(store, statement, params, f"record {namespace}/{key}")


class _Redis:
    """A hash field written with the store's own client."""

    @staticmethod
    async def _set(store: Any, key: str, field: str, raw: str, what: str) -> None:
        client = store._redis
        if not await client.hexists(key, field):
            raise _missing(what)
        await client.hset(key, field, raw)

    async def session(self, store: Any, tenant: str, session_id: str, raw: str) -> None:
        key = store.keys.head(tenant, session_id)
        await self._set(store, key, "doc", raw, f"session {session_id!r}")

    async def record(self, store: Any, tenant: str, namespace: str, key: str, raw: str) -> None:
        where = store.keys.record(tenant, namespace, key)
        await self._set(store, where, "d", raw, f"record {namespace}/{key}")


class _Files:
    """The file rewritten in place, and its backup gone (so it cannot be restored)."""

    @staticmethod
    def _write(path: Path, raw: str, what: str) -> None:
        if not path.exists():
            raise _missing(what)
        path.write_text(raw)
        path.with_name(path.name + ".bak").unlink(missing_ok=True)

    async def session(self, store: Any, tenant: str, session_id: str, raw: str) -> None:
        path = Path(store.root) / tenant / "sessions" / f"{session_id}.json"
        await asyncio.to_thread(self._write, path, raw, f"session {session_id!r}")

    async def record(self, store: Any, tenant: str, namespace: str, key: str, raw: str) -> None:
        path = Path(store.root) / tenant / "records" / namespace / f"{key}.json"
        await asyncio.to_thread(self._write, path, raw, f"record {namespace}/{key}")


register_damager("statekeeper.stores.sqlite.store.SQLiteStore", _SQLite())
register_damager("statekeeper.stores.postgres.store.PostgresStore", _Postgres())
register_damager("statekeeper.stores.redis.store.RedisStore", _Redis())
register_damager("statekeeper.stores.files.store.FileStore", _Files())
