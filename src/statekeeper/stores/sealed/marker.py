"""The record that says a store is sealed, and the check `open_store` makes with it.

A store opened with a keyring keeps one plain record, in a tenant of its own::

    tenant "statekeeper:store", namespace "store", key "sealing"
    {"sealed": true, "format": 2, "key_ids": ["2026-11", "2027-01"]}

``key_ids`` are the keys it has been sealed with (a key id is added the first time a
keyring with it as current opens the store; ids are never removed, so it says which
keys data may still need, not which ones it does). `check_opening` reads it where
`open_store` opens a store (so the CLI and the server too): a sealed store opened
without its keyring is refused with `WrongKeyError` naming the fix, before any row is
read or written; a store opened with a keyring gets the record written if it lacks it
(a store sealed before the record existed included).

It goes through the `Store` protocol, so it works the same on every backend. What it
does not cover: a backend opened with its own constructor (``SQLiteStore.open(...)``)
rather than `open_store` is not checked, and ``memory://`` (a new store at every open)
has no record. The record is written in clear, to be readable without keys: it guards
against mistakes (a process started without the keyring), not against someone who can
write the database (they could delete it; a keyring holder still refuses plain rows).
"""

from __future__ import annotations

from typing import Any, Final

from statekeeper.codec import WrongKeyError
from statekeeper.errors import ConflictError, NotFoundError, StoreReadOnlyError
from statekeeper.stores.base import Store
from statekeeper.stores.sealed.keyring import SEALED_VERSION, Keyring

__all__ = ["MARKER", "check_opening", "read_marker"]

MARKER: Final = ("statekeeper:store", "store", "sealing")
"""Tenant, namespace and key of the record that marks a store sealed (reserved)."""
_EXEMPT: Final = frozenset({"memory"})
"""Schemes whose stores live in one process only: nothing to mark."""


async def read_marker(store: Store) -> dict[str, Any] | None:
    """The sealing record of a plain (unwrapped) store, or None if it has none."""
    try:
        record = await store.get_record(*MARKER)
    except NotFoundError:
        return None
    value = record.value
    return value if isinstance(value, dict) and value.get("sealed") is True else None


async def check_opening(store: Store, scheme: str, url: str, keyring: Keyring | None) -> None:
    """Refuse a sealed store opened without a keyring; mark one opened with a keyring.

    ``store`` is the backend as opened (not wrapped yet). Raises `WrongKeyError` when it
    is marked sealed and ``keyring`` is None.
    """
    if scheme in _EXEMPT:
        return
    marker = await read_marker(store)
    if keyring is None:
        if marker is not None:
            ids = ", ".join(repr(k) for k in marker.get("key_ids", ()) if isinstance(k, str))
            raise WrongKeyError(
                f"store {_shown(url)} is sealed (encrypted at rest, key ids {ids or '?'}) but "
                "was opened without a keyring: nothing was read or written. Open it with "
                "keyring=Keyring(...) or ?keyring=env:VARIABLE / ?keyring=file:PATH (see "
                "docs/encryption.md)"
            )
        return
    await _mark(store, marker, keyring.current)


async def _mark(store: Store, marker: dict[str, Any] | None, current: str) -> None:
    """Write the record, or add ``current`` to its key ids (compare-and-set, retried)."""
    for _ in range(5):
        if marker is None:
            value: dict[str, Any] = {"sealed": True, "format": SEALED_VERSION, "key_ids": []}
            expected = 0
        else:
            key_ids = marker.get("key_ids")
            if isinstance(key_ids, list) and current in key_ids:
                return
            value = dict(marker)
            expected = (await store.get_record(*MARKER)).version
        ids = value.get("key_ids")
        value["key_ids"] = [*(ids if isinstance(ids, list) else []), current]
        try:
            await store.put_record(*MARKER, value, expected_version=expected)
            return
        except ConflictError:  # another process marked it meanwhile: look again
            marker = await read_marker(store)
        except StoreReadOnlyError:
            return  # a read-only handle writes nothing; the next writer marks it
    return


def _shown(url: str) -> str:
    """The URL without its query (which may name where a keyring lives) or password."""
    base = url.split("?", 1)[0]
    scheme, sep, rest = base.partition("://")
    if "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"
