"""Moving a tenant's rows forward to the keyring's current key (after a key rotation, or
to seal rows written before encryption was turned on).

`reseal` rewrites every session head, transcript entry, event (of the tenant's runs'
event logs, and those named) and record (of statekeeper's own namespaces, and those
named) that is not sealed with the current key, and every entry sealed before entries
were bound to their seq (envelope version 1): heads and records with compare-and-set,
entries and events with the backends' payload rewrite (``rewrite_entry_payloads`` /
``rewrite_event_payloads``, see ``docs/stores.md``), which replaces a payload only if it
is still the one read. Nothing else about a row changes. With ``check=True`` it writes
nothing and only counts. The report's ``left`` counts the rows of every kind it went
through that are still on another key: when it is empty, none of them needs an old key.
The ``statekeeper reseal`` command runs it with a progress bar.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

from statekeeper.codec import StateTamperedError
from statekeeper.errors import ConflictError, InvalidInputError, NotFoundError
from statekeeper.stores.base import EntryKind, Event, SessionQuery, SessionRecord, Store
from statekeeper.stores.sealed.fields import SEALED_KEY, SESSION_FIELDS, sealed_text
from statekeeper.stores.sealed.keyring import SEALED_VERSION
from statekeeper.stores.sealed.store import SealedStore

__all__ = ["BUILTIN_NAMESPACES", "DAMAGED", "PLAIN", "ResealReport", "reseal"]

BUILTIN_NAMESPACES = (
    "runs",
    "run-children",
    "subagents",
    "auth_profiles",
    "openai_agents.run_states",
    "state.user",
    "state.app",
    "adk.state",
    "langgraph.runs",
)
"""Record namespaces statekeeper itself writes: run heads, the live children of parent
runs, subagents, auth profiles, saved run states of the OpenAI Agents adapter, scoped
session state, ADK state, LangGraph run markers. `reseal` always goes through them; a
long-term store writes ``ltm.<name>``, and an application namespaces of its own: name
those too (no store can list a tenant's namespaces)."""
PLAIN = "(plain)"
"""How a report names rows that are not sealed at all."""
DAMAGED = "(damaged)"
"""How a report names rows whose sealed value cannot be read (they are left as they are)."""
RUNS = "runs"
"""The namespace of run heads: each run's event log has its run id."""
_RETRIES = 5
_PAGE = 500


class _Rewriter(Store, Protocol):
    async def rewrite_session_fields(
        self, tenant: str, session_id: str, fields: dict[str, Any], *, expected_version: int
    ) -> SessionRecord: ...

    async def rewrite_entry_payloads(
        self, tenant: str, session_id: str, payloads: dict[str, tuple[Any, Any]]
    ) -> int: ...

    async def rewrite_event_payloads(
        self, tenant: str, log_id: str, payloads: dict[int, tuple[Any, Any]]
    ) -> int: ...


def _rewrites(store: object) -> TypeGuard[_Rewriter]:
    names = ("rewrite_session_fields", "rewrite_entry_payloads", "rewrite_event_payloads")
    return all(callable(getattr(store, name, None)) for name in names)


@dataclass
class ResealReport:
    """What `reseal` did for one tenant."""

    sessions: int = 0
    """Session heads seen."""
    sessions_resealed: int = 0
    entries: int = 0
    """Transcript entries seen."""
    entries_resealed: int = 0
    events: int = 0
    """Events seen (in the event logs of the tenant's runs, and those named)."""
    events_resealed: int = 0
    records: int = 0
    """Records seen (in the namespaces asked for)."""
    records_resealed: int = 0
    raced: int = 0
    """Rows another writer changed meanwhile (they were left to that writer's key)."""
    left: Counter[str] = field(default_factory=Counter)
    """Rows of every kind gone through (session heads, entries, events, records) still
    not on the current key, by the key id they are sealed with (`PLAIN`, `DAMAGED`):
    empty when every one is on the current key."""
    left_kinds: dict[str, Counter[str]] = field(default_factory=dict)
    """`left` by key id, then by kind of row (``sessions``, ``entries``, ``events``,
    ``records``)."""
    sealed_with: Counter[str] = field(default_factory=Counter)
    """Rows gone through by the key id they are sealed with after the run (the current
    one included; `PLAIN`, `DAMAGED`)."""
    unbound: int = 0
    """Entries on the current key still in the format before entries were bound to
    their seq (envelope version 1; a check counts them, a reseal binds them)."""
    namespaces: tuple[str, ...] = ()
    """The record namespaces gone through."""
    checked: bool = False
    """True for a check (``check=True``): nothing was written."""

    def leave(self, key: str, kind: str) -> None:
        """Count a row of ``kind`` left on ``key``."""
        self.left[key] += 1
        self.left_kinds.setdefault(key, Counter())[kind] += 1
        self.sealed_with[key] += 1

    def old_keys(self, current: str) -> list[str]:
        """The key ids (not `PLAIN` or `DAMAGED`) other than ``current`` that still seal
        something: the keys that cannot be dropped yet."""
        return sorted(k for k in self.left if k not in (PLAIN, DAMAGED, current))


async def reseal(
    store: Store,
    tenant: str,
    *,
    namespaces: Iterable[str] = (),
    event_logs: Iterable[str] = (),
    progress: Callable[[int, int, ResealReport], None] | None = None,
    check: bool = False,
) -> ResealReport:
    """Reseal ``tenant``'s session heads, transcript entries, events and records with the
    current key (with ``check=True``, only count what is sealed with each key).

    ``store`` is a `SealedStore` holding the new key as current and every older key (with
    ``allow_plain=True`` to seal rows written before encryption). Records are resealed
    in `BUILTIN_NAMESPACES` and in ``namespaces`` (added to them), events in the event
    log of each run (the keys of the ``runs`` records) and in ``event_logs``.
    ``progress(done, total, report)`` is called after each session and each event log,
    with the counts so far. Safe to run while the store is in use (appends meanwhile
    are kept), and to run again: rows already on the current key are left alone.
    """
    if not isinstance(store, SealedStore):
        raise InvalidInputError(
            "reseal needs a sealed store: open it with keyring=... (the new key current, "
            "the old ones kept)"
        )
    if not _rewrites(store.wrapped):
        raise InvalidInputError(
            f"{type(store.wrapped).__name__} cannot rewrite rows in place; reseal needs a "
            "built-in backend (or one implementing the payload rewrites of docs/stores.md)"
        )
    if isinstance(namespaces, str):
        raise InvalidInputError("namespaces is a list of names, like ('ltm.default',)")
    names = tuple(dict.fromkeys([*BUILTIN_NAMESPACES, *namespaces]))
    report = ResealReport(namespaces=names, checked=bool(check))
    ids = await _session_ids(store, tenant)
    logs = sorted({*await _record_keys(store, tenant, RUNS), *event_logs})
    total = len(ids) + len(logs)
    for done, session_id in enumerate(ids, 1):
        try:
            await _reseal_head(store, tenant, session_id, report)
            await _reseal_entries(store, tenant, session_id, report)
        except NotFoundError:
            pass  # deleted meanwhile: nothing of it is left to reseal
        if progress is not None:
            progress(done, total, report)
    for done, log_id in enumerate(logs, len(ids) + 1):
        await _reseal_events(store, tenant, log_id, report)
        if progress is not None:
            progress(done, total, report)
    for namespace in names:
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
    if envelope is None:
        return PLAIN
    try:
        return store.keyring.key_id_of(envelope)
    except StateTamperedError:
        return DAMAGED


async def _record_keys(store: SealedStore, tenant: str, namespace: str) -> list[str]:
    keys: list[str] = []
    while True:
        page = await store.wrapped.list_records(
            tenant, namespace, after_key=keys[-1] if keys else None, limit=_PAGE
        )
        keys += [record.key for record in page]
        if len(page) < _PAGE:
            return keys


def _stale(store: SealedStore, payload: Any, kind_is_corrupt: bool) -> str | None:
    """The key a stored payload is on when it should move (None: leave it)."""
    key = _key_of(store, payload)
    if key == store.keyring.current or kind_is_corrupt:
        return None
    return key


def _unbound(store: SealedStore, payload: Any) -> bool:
    """Whether a stored entry payload is sealed in the format before entries were bound
    to their seq and parent (envelope version 1)."""
    envelope = sealed_text(payload)
    try:
        return envelope is not None and store.keyring.version_of(envelope) < SEALED_VERSION
    except StateTamperedError:
        return False


async def _reseal_entries(
    store: SealedStore, tenant: str, session_id: str, report: ResealReport
) -> None:
    inner = store.wrapped
    assert _rewrites(inner)
    after = 0
    current = store.keyring.current
    while page := await inner.read_entries(tenant, session_id, after_seq=after, limit=_PAGE):
        after = page[-1].seq
        report.entries += len(page)
        rewrites: dict[str, tuple[Any, Any]] = {}
        for raw in page:
            key = _stale(store, raw.payload, raw.kind == EntryKind.CORRUPT)
            if key is None and not (raw.kind != EntryKind.CORRUPT and _unbound(store, raw.payload)):
                report.sealed_with[_key_of(store, raw.payload)] += 1
                continue
            if report.checked:
                if key is None:
                    report.unbound += 1
                    report.sealed_with[current] += 1
                else:
                    report.leave(key, "entries")
                continue
            opened = store._open_entry(tenant, session_id, raw)  # WrongKeyError: a lost key
            if opened.kind == EntryKind.CORRUPT:
                report.leave(PLAIN if key == PLAIN else DAMAGED, "entries")
                continue
            _, sealed = store.seal_entry(
                tenant, session_id, raw.id, raw.kind, opened.payload, raw.seq, raw.parent_seq
            )
            rewrites[raw.id] = (raw.payload, sealed)
        if not rewrites:
            continue
        done = await inner.rewrite_entry_payloads(tenant, session_id, rewrites)
        report.entries_resealed += done
        report.sealed_with[current] += done
        if done < len(rewrites):  # changed meanwhile (pruned, or resealed by another run)
            report.raced += len(rewrites) - done
            for entry_id in rewrites:
                try:
                    now = await inner.get_entry(tenant, session_id, entry_id)
                except NotFoundError:
                    continue
                if now.payload == rewrites[entry_id][1]:
                    continue  # this one was moved
                if _stale(store, now.payload, now.kind == EntryKind.CORRUPT) is not None:
                    report.leave(_key_of(store, now.payload), "entries")


async def _reseal_events(
    store: SealedStore, tenant: str, log_id: str, report: ResealReport
) -> None:
    inner = store.wrapped
    assert _rewrites(inner)
    after = 0
    while page := await inner.read_events(tenant, log_id, after_seq=after, limit=_PAGE):
        after = page[-1].seq
        report.events += len(page)
        rewrites: dict[int, tuple[Any, Any]] = {}
        for raw in page:
            stand_in = _corrupt_event(raw) and sealed_text(raw.payload) is None
            key = _stale(store, raw.payload, stand_in)
            if key is None:
                report.sealed_with[_key_of(store, raw.payload)] += 1
                continue
            if report.checked:
                report.leave(key, "events")
                continue
            opened = store._open_event(tenant, raw)  # WrongKeyError: a lost key
            if _corrupt_event(opened):
                report.leave(PLAIN if key == PLAIN else DAMAGED, "events")
                continue
            _, sealed = store.seal_event(tenant, log_id, raw, opened.payload)
            rewrites[raw.seq] = (raw.payload, sealed)
        if rewrites:
            done = await inner.rewrite_event_payloads(tenant, log_id, rewrites)
            report.events_resealed += done
            report.sealed_with[store.keyring.current] += done
            report.raced += len(rewrites) - done  # events never change but by another reseal


def _corrupt_event(event: Event) -> bool:
    return (event.stream, event.kind) == ("error", "corrupt")


def _stored_fields(raw: SessionRecord) -> dict[str, Any]:
    """The sealed envelope of each sealed field of a stored head (None: none)."""
    return {
        "title": raw.title[8:] if raw.title and raw.title.startswith("~sealed:") else None,
        "metadata": raw.metadata.get(SEALED_KEY),
        "delivery": raw.delivery.extra.get(SEALED_KEY) if raw.delivery else None,
        "state": sealed_text(raw.state),
    }


def _field_keys(store: SealedStore, raw: SessionRecord) -> dict[str, str]:
    """The key (or `PLAIN`, `DAMAGED`) of each field of a stored head that holds data."""
    keys: dict[str, str] = {}
    for name, value in _stored_fields(raw).items():
        if isinstance(value, str) and value:
            try:
                keys[name] = store.keyring.key_id_of(value)
            except StateTamperedError:
                keys[name] = DAMAGED
        elif getattr(raw, name) or (name == "metadata" and _plain_metadata(store, raw)):
            keys[name] = PLAIN
    return keys


def _stale_fields(store: SealedStore, raw: SessionRecord) -> list[str]:
    """The sealed fields of a stored head that are not sealed with the current key."""
    current = store.keyring.current
    keys = _field_keys(store, raw)
    return [name for name in SESSION_FIELDS if name in keys and keys[name] != current]


def _plain_metadata(store: SealedStore, raw: SessionRecord) -> bool:
    return any(k != SEALED_KEY and k not in store.clear_metadata for k in raw.metadata)


def _leave_head(store: SealedStore, raw: SessionRecord, report: ResealReport) -> None:
    """Count a head left as it is, once for each key its fields are on."""
    keys = set(_field_keys(store, raw).values())
    for key in keys - {store.keyring.current}:
        report.leave(key, "sessions")
    if store.keyring.current in keys or not keys:
        report.sealed_with[store.keyring.current] += 1


async def _reseal_head(
    store: SealedStore, tenant: str, session_id: str, report: ResealReport
) -> None:
    inner = store.wrapped
    assert _rewrites(inner)
    report.sessions += 1
    raw = None
    for _ in range(_RETRIES):
        raw = await inner.get_session(tenant, session_id)
        stale = _stale_fields(store, raw)
        if not stale or report.checked:
            _leave_head(store, raw, report)
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
        report.sealed_with[store.keyring.current] += 1
        return
    report.raced += 1
    if raw is not None:
        _leave_head(store, raw, report)


async def _reseal_records(
    store: SealedStore, tenant: str, namespace: str, report: ResealReport
) -> None:
    after: str | None = None
    current = store.keyring.current
    while True:
        page = await store.wrapped.list_records(tenant, namespace, after_key=after, limit=500)
        for raw in page:
            report.records += 1
            key = _key_of(store, raw.value)
            if key == current:
                report.sealed_with[key] += 1
                continue
            if report.checked or key == DAMAGED or (key == PLAIN and not store.allow_plain):
                report.leave(key, "records")
                continue
            opened = await store.get_record(tenant, namespace, raw.key)
            if opened.version != raw.version:
                report.raced += 1
                report.leave(key, "records")
                continue
            try:
                await store.put_record(
                    tenant, namespace, raw.key, opened.value,
                    expected_version=raw.version, expires_at=raw.expires_at,
                )  # fmt: skip
            except ConflictError:
                report.raced += 1  # written meanwhile, by a writer with its own ring
                report.leave(key, "records")
                continue
            report.records_resealed += 1
            report.sealed_with[current] += 1
        for _ in page.corrupt:  # the backend cannot decode them: on no key
            report.records += 1
            report.leave(DAMAGED, "records")
        if len(page) < 500:
            return
        after = page[-1].key
