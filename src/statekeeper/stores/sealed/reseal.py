"""Moving a tenant's rows forward to the keyring's current key (after a key rotation, or
to seal rows written before encryption was turned on).

`reseal` rewrites, with compare-and-set, every session head and every record (of the
namespaces named) whose sealed fields are not sealed with the current key, and counts the
transcript entries by the key they are sealed with: entries are append-only on every
backend (an entry is written once and never rewritten), so they stay sealed with the key
they were written with, and that key must stay in the keyring while they exist (see
``docs/encryption.md``). The ``statekeeper reseal`` command runs it with a progress bar.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

from statekeeper.errors import ConflictError, InvalidInputError
from statekeeper.stores.base import SessionQuery, SessionRecord, Store
from statekeeper.stores.sealed.fields import SEALED_KEY, SESSION_FIELDS, sealed_text
from statekeeper.stores.sealed.store import SealedStore

__all__ = ["BUILTIN_NAMESPACES", "PLAIN", "ResealReport", "reseal"]

BUILTIN_NAMESPACES = (
    "runs",
    "subagents",
    "auth_profiles",
    "openai_agents.run_states",
    "state.user",
    "state.app",
)
"""Record namespaces statekeeper itself writes: run heads, subagents, auth profiles, saved
run states of the OpenAI Agents adapter, scoped session state (a long-term store writes
``ltm.<name>``: name it too)."""
PLAIN = "(plain)"
"""How a report names rows that are not sealed at all."""
_RETRIES = 5


class _HeadRewriter(Store, Protocol):
    async def rewrite_session_fields(
        self, tenant: str, session_id: str, fields: dict[str, Any], *, expected_version: int
    ) -> SessionRecord: ...


def _rewrites_heads(store: object) -> TypeGuard[_HeadRewriter]:
    return callable(getattr(store, "rewrite_session_fields", None))


@dataclass
class ResealReport:
    """What `reseal` did for one tenant."""

    sessions: int = 0
    """Session heads seen."""
    sessions_resealed: int = 0
    records: int = 0
    """Records seen (in the namespaces asked for)."""
    records_resealed: int = 0
    raced: int = 0
    """Rows another writer changed meanwhile (they were left to that writer's key)."""
    entries: Counter[str] = field(default_factory=Counter)
    """Transcript entries by the key id they are sealed with (`PLAIN` for none)."""


async def reseal(
    store: Store,
    tenant: str,
    *,
    namespaces: Iterable[str] = BUILTIN_NAMESPACES,
    progress: Callable[[int, int], None] | None = None,
) -> ResealReport:
    """Reseal ``tenant``'s session heads and records with the current key.

    ``store`` is a `SealedStore` holding the new key as current and every older key (with
    ``allow_plain=True`` to seal rows written before encryption). ``progress(done,
    total)`` is called after each session. Safe to run while the store is in use, and to
    run again: rows already on the current key are left alone.
    """
    if not isinstance(store, SealedStore):
        raise InvalidInputError(
            "reseal needs a sealed store: open it with keyring=... (the new key current, "
            "the old ones kept)"
        )
    report = ResealReport()
    ids = await _session_ids(store, tenant)
    for done, session_id in enumerate(ids, 1):
        await _reseal_head(store, tenant, session_id, report)
        for entry in await store.wrapped.read_entries(tenant, session_id):
            report.entries[_key_of(store, entry.payload)] += 1
        if progress is not None:
            progress(done, len(ids))
    for namespace in namespaces:
        await _reseal_records(store, tenant, namespace, report)
    return report


async def _session_ids(store: SealedStore, tenant: str) -> list[str]:
    ids: list[str] = []
    query = SessionQuery(limit=1000)
    while True:
        page = await store.wrapped.list_sessions(tenant, query)
        ids += [record.id for record in page.items]
        if page.next_cursor is None:
            return ids
        query = SessionQuery(limit=1000, cursor=page.next_cursor)


def _key_of(store: SealedStore, value: Any) -> str:
    envelope = sealed_text(value)
    return PLAIN if envelope is None else store.keyring.key_id_of(envelope)


def _stale_fields(store: SealedStore, raw: SessionRecord) -> list[str]:
    """The sealed fields of a stored head that are not sealed with the current key."""
    current = store.keyring.current
    stored: dict[str, Any] = {
        "title": raw.title[8:] if raw.title and raw.title.startswith("~sealed:") else None,
        "metadata": raw.metadata.get(SEALED_KEY),
        "delivery": raw.delivery.extra.get(SEALED_KEY) if raw.delivery else None,
        "state": sealed_text(raw.state),
    }
    stale = []
    for name in SESSION_FIELDS:
        value = stored[name]
        if isinstance(value, str) and value and store.keyring.key_id_of(value) == current:
            continue
        if getattr(raw, name) or (name == "metadata" and _plain_metadata(store, raw)):
            stale.append(name)
    return stale


def _plain_metadata(store: SealedStore, raw: SessionRecord) -> bool:
    return any(k != SEALED_KEY and k not in store.clear_metadata for k in raw.metadata)


async def _reseal_head(
    store: SealedStore, tenant: str, session_id: str, report: ResealReport
) -> None:
    inner = store.wrapped
    if not _rewrites_heads(inner):
        raise InvalidInputError(
            f"{type(inner).__name__} cannot rewrite session heads in place; reseal needs "
            "a built-in backend"
        )
    report.sessions += 1
    for _ in range(_RETRIES):
        raw = await inner.get_session(tenant, session_id)
        stale = _stale_fields(store, raw)
        if not stale:
            return
        opened = store._fields.open_session(raw)
        plain = {name: getattr(opened, name) for name in stale}
        fields = store._fields.seal_session(tenant, session_id, plain)
        try:
            await inner.rewrite_session_fields(
                tenant, session_id, fields, expected_version=raw.version
            )
        except ConflictError:
            continue  # written meanwhile: look again
        report.sessions_resealed += 1
        return
    report.raced += 1


async def _reseal_records(
    store: SealedStore, tenant: str, namespace: str, report: ResealReport
) -> None:
    after: str | None = None
    current = store.keyring.current
    while True:
        page = await store.wrapped.list_records(tenant, namespace, after_key=after, limit=500)
        for raw in page:
            report.records += 1
            if _key_of(store, raw.value) == current:
                continue
            opened = await store.get_record(tenant, namespace, raw.key)
            if opened.version != raw.version:
                report.raced += 1
                continue
            try:
                await store.put_record(
                    tenant, namespace, raw.key, opened.value,
                    expected_version=raw.version, expires_at=raw.expires_at,
                )  # fmt: skip
            except ConflictError:
                report.raced += 1  # written meanwhile, by a writer with its own ring
                continue
            report.records_resealed += 1
        if len(page) < 500:
            return
        after = page[-1].key
