"""`SealedStore`: any store, with what a tenant stores sealed on the way in and opened on
the way out (AES-256-GCM, bound to tenant and owner; see ``docs/encryption.md``).

It implements the whole `Store` protocol by delegating to the wrapped store, as
`statekeeper.tracing.TracedStore` does; anything else (a backend's own methods) passes
through unchanged.

A transcript entry that fails to open is reported like a row the backend cannot decode
(a ``corrupt`` stand-in carrying the error, so one bad row never hides the rest), and so is
an event; a session head or a record that fails to open raises `StateTamperedError`. A
value sealed with a key the keyring lacks always raises `WrongKeyError` naming the key id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from pydantic import JsonValue

from statekeeper.codec import StateTamperedError, WrongKeyError
from statekeeper.errors import InvalidInputError
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, encode_json, gc_paused, loads
from statekeeper.stores.base import (
    AppendResult,
    CorruptItem,
    Entry,
    EntryDraft,
    EntryKind,
    Event,
    EventBatch,
    EventDraft,
    Page,
    RecordList,
    SessionPatch,
    SessionQuery,
    SessionRecord,
    Store,
    VersionedRecord,
    WrappingStore,
)
from statekeeper.stores.rules import (
    check_record_ids,
    check_tenant_and_id,
    corrupt_entry,
    to_micros,
)
from statekeeper.stores.sealed.entries import (
    Head,
    append_bound,
    entry_bindings,
    missing_parents,
    remember,
)
from statekeeper.stores.sealed.fields import SEALED_KEY, FieldSealer, sealed_text
from statekeeper.stores.sealed.keyring import Keyring, bindings
from statekeeper.stores.sealed.listing import list_opened

__all__ = ["SealedStore", "sealed"]


class SealedStore(WrappingStore):
    """A store whose tenants' data is sealed at rest with a `Keyring`.

    Args:
        store: the store to wrap (any backend, or another wrapper).
        keyring: the keys; new rows are sealed with its current key.
        clear_metadata: session metadata keys stored in clear, so listings can filter on
            them (every other metadata key is sealed).
        allow_plain: accept rows stored unsealed (data from before encryption was turned
            on) until `statekeeper reseal` has sealed them; off by default, because a
            reader that accepts plain rows lets anyone who can write the store slip in
            rows of their own.
        max_payload_bytes: the largest value accepted, as JSON before sealing (default:
            the wrapped store's limit, which then applies to the sealed size as well;
            `open_store` raises the backend's limit to fit the sealed form).
    """

    def __init__(
        self,
        store: Store,
        keyring: Keyring,
        *,
        clear_metadata: Iterable[str] = (),
        allow_plain: bool = False,
        max_payload_bytes: int | None = None,
    ) -> None:
        if not isinstance(keyring, Keyring):
            raise InvalidInputError(
                f"keyring must be a statekeeper.Keyring, got {type(keyring).__name__}"
            )
        if isinstance(clear_metadata, str):
            raise InvalidInputError("clear_metadata is a list of keys, like ('customer',)")
        clear = frozenset(validate_id(k, "clear_metadata key") for k in clear_metadata)
        self.wrapped = store
        self.url = store.url
        self.keyring = keyring
        self.clear_metadata = clear
        self.allow_plain = bool(allow_plain)
        inner_limit = getattr(store, "max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES)
        limit = inner_limit if max_payload_bytes is None else max_payload_bytes
        self.max_payload_bytes = limit
        """The largest JSON value (entry, record, event) accepted, before sealing."""
        self._fields = FieldSealer(keyring, clear, self.allow_plain, limit)
        self._limit = limit
        self.heads: dict[tuple[str, str], Head] = {}
        """(tenant, session id) -> the head last seen: where its next append goes."""
        self.appending: dict[tuple[int, str, str], tuple[asyncio.Lock, list[int]]] = {}
        """(event loop, tenant, session id) -> the lock of its appends, and their count."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("rewrite_"):  # raw payloads below the seal: reseal's, on .wrapped
            raise AttributeError(f"{name} is not offered through a sealed store")
        return super().__getattr__(name)

    def __repr__(self) -> str:
        return f"SealedStore({self.wrapped!r}, {self.keyring!r})"

    # -- sessions ------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        """See `statekeeper.stores.base.SessionStore.create_session`."""
        check_tenant_and_id(record.tenant, record.id)
        fields = {name: getattr(record, name) for name in ("title", "metadata", "delivery")}
        fields["state"] = record.state
        sealed = record.model_copy(
            update=self._fields.seal_session(record.tenant, record.id, fields)
        )
        created = await self.wrapped.create_session(sealed)
        remember(self, created)
        return self._fields.open_session(created)

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        """See `statekeeper.stores.base.SessionStore.get_session`."""
        record = await self.wrapped.get_session(tenant, session_id)
        remember(self, record)
        return self._fields.open_session(record)

    async def update_session(
        self,
        tenant: str,
        session_id: str,
        patch: SessionPatch,
        *,
        expected_version: int | None = None,
    ) -> SessionRecord:
        """See `statekeeper.stores.base.SessionStore.update_session`."""
        check_tenant_and_id(tenant, session_id)
        updated = await self.wrapped.update_session(
            tenant, session_id, self._seal_patch(tenant, session_id, patch),
            expected_version=expected_version,
        )  # fmt: skip
        remember(self, updated)
        return self._fields.open_session(updated)

    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        """See `statekeeper.stores.base.SessionStore.list_sessions`.

        A filter on a sealed metadata key cannot run in the backend: it is answered by
        opening the tenant's sessions that pass the other filters, page by page (declare
        keys that listings filter on often with ``clear_metadata``).
        """
        return await list_opened(self.wrapped, self._fields, tenant, query)

    async def delete_session(self, tenant: str, session_id: str) -> None:
        """See `statekeeper.stores.base.SessionStore.delete_session`."""
        self.heads.pop((tenant, session_id), None)
        await self.wrapped.delete_session(tenant, session_id)

    def _seal_patch(self, tenant: str, session_id: str, patch: SessionPatch) -> SessionPatch:
        if not isinstance(patch, SessionPatch) or not patch.set:
            return patch  # nothing sealed in it (or not a patch: the store refuses it)
        sealed = self._fields.seal_session(tenant, session_id, patch.set)
        return SessionPatch(set=sealed, add=patch.add)

    # -- transcripts ---------------------------------------------------------------------

    async def append_entries(
        self,
        tenant: str,
        session_id: str,
        drafts: Sequence[EntryDraft],
        *,
        expected_version: int | None = None,
        patch: SessionPatch | None = None,
        move_head: bool = True,
        events: EventBatch | None = None,
    ) -> AppendResult:
        """See `statekeeper.stores.base.TranscriptStore.append_entries`.

        Payloads are sealed deterministically (bound to tenant, session, entry id, kind,
        seq and parent seq: see `statekeeper.stores.sealed.entries`), so a retried
        append is recognised by the store as identical. Events are sealed as
        `append_events` seals them.
        """
        check_tenant_and_id(tenant, session_id)
        for draft in drafts:
            validate_id(draft.id, "entry id")
        if patch is not None:
            patch = self._seal_patch(tenant, session_id, patch)
        texts: list[str] = []
        if events is not None:
            check_record_ids(tenant, events.log_id)
            texts, sealed_events = self._seal_events(tenant, events.log_id, events.events)
            events = EventBatch(events.log_id, sealed_events)
        extra: dict[str, Any] = {"patch": patch, "move_head": move_head, "events": events}
        if drafts:
            result, plain = await append_bound(
                self, tenant, session_id, drafts, expected_version=expected_version, extra=extra
            )
        else:  # refused by the backend, as on a plain store
            plain = {}
            result = await self.wrapped.append_entries(
                tenant, session_id, drafts, expected_version=expected_version, **extra
            )
        entries = [
            e._replace(payload=loads(plain[e.id]))
            if e.id in plain and sealed_text(e.payload) is not None
            else self._open_entry(tenant, session_id, e)
            for e in result.entries
        ]
        return AppendResult.model_construct(
            session=self._fields.open_session(result.session),
            entries=entries,
            replayed=result.replayed,
            events=_opened(result.events, texts) if result.events else [],
        )

    async def read_entries(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        """See `statekeeper.stores.base.TranscriptStore.read_entries`."""
        entries = await self.wrapped.read_entries(
            tenant, session_id, after_seq=after_seq, until_seq=until_seq, limit=limit
        )
        return missing_parents(self._open_entries(tenant, session_id, entries), after_seq)

    async def get_entry(self, tenant: str, session_id: str, entry_id: str) -> Entry:
        """See `statekeeper.stores.base.TranscriptStore.get_entry`."""
        entry = await self.wrapped.get_entry(tenant, session_id, entry_id)
        return self._open_entry(tenant, session_id, entry)

    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        """See `statekeeper.stores.base.TranscriptStore.prune_entries` (kinds stay clear)."""
        self.heads.pop((tenant, session_id), None)  # it moves the head's version
        return await self.wrapped.prune_entries(
            tenant, session_id, kind=kind, before_seq=before_seq, id_prefix=id_prefix
        )

    def seal_entry(
        self,
        tenant: str,
        session_id: str,
        entry_id: str,
        kind: str,
        payload: Any,
        seq: int,
        parent: int | None,
    ) -> tuple[str, dict[str, Any]]:
        """An entry payload's JSON and its stored form at ``seq`` under ``parent`` (sealed
        deterministically, so a retried append stores the same bytes; used by appends
        and by reseal)."""
        text = encode_json(payload, what=f"entry {entry_id!r}", limit=self._limit)
        binding = entry_bindings(tenant, session_id, entry_id, str(kind), seq, parent)[0]
        return text, {SEALED_KEY: self.keyring.seal(text.encode(), binding, deterministic=True)}

    def _open_entries(self, tenant: str, session_id: str, entries: list[Entry]) -> list[Entry]:
        # The hot path of every transcript load: the binding is built from parts encoded
        # once (per read, per kind), and entries are made without namedtuple._replace.
        prefix = bindings("entry", tenant, session_id)
        kinds: dict[str, bytes] = {}
        unseal = self.keyring.open_or_none
        out: list[Entry] = []
        with gc_paused():
            for entry in entries:
                seq, entry_id, parent, kind, created, payload = entry
                envelope = payload.get(SEALED_KEY) if len(payload) == 1 else None
                if type(envelope) is str:
                    suffix = kinds.get(kind)
                    if suffix is None:
                        suffix = kinds[kind] = bindings(kind)
                    name = entry_id.encode()  # bindings(entry_id), inlined: once per row
                    legacy = prefix + len(name).to_bytes(4, "big") + name + suffix
                    at = str(seq).encode()  # bindings(seq, parent or 0), inlined
                    under = str(parent or 0).encode()
                    binding = legacy + len(at).to_bytes(4, "big") + at
                    binding += len(under).to_bytes(4, "big") + under
                    text = unseal(envelope, binding, legacy)
                    if text is not None:  # else the slow path below reports it (or raises)
                        out.append(_entry((seq, entry_id, parent, kind, created, loads(text))))
                        continue
                out.append(self._open_entry(tenant, session_id, entry))
        return out

    def _open_entry(self, tenant: str, session_id: str, entry: Entry) -> Entry:
        envelope = sealed_text(entry.payload)
        if envelope is None:
            if entry.kind == EntryKind.CORRUPT or self.allow_plain:
                return entry  # the backend's own stand-in, or a row from before sealing
            problem = "it is stored unsealed, but this store seals entries"
            return self._corrupt(entry, problem, str(entry.payload))
        binding, legacy = entry_bindings(
            tenant, session_id, entry.id, entry.kind, entry.seq, entry.parent_seq
        )
        try:
            text = self.keyring.open(envelope, binding, legacy)
        except StateTamperedError as exc:
            if type(exc) is not StateTamperedError:  # WrongKeyError: never a stand-in
                raise
            problem = (
                f"entry {entry.id!r} at seq {entry.seq} (parent {entry.parent_seq}): {exc}; "
                "or it is not at the seq or under the parent it was written with (entries "
                "reordered)"
            )
            return self._corrupt(entry, problem, envelope)
        return entry._replace(payload=loads(text))

    @staticmethod
    def _corrupt(entry: Entry, problem: str, raw: str) -> Entry:
        return corrupt_entry(entry.seq, entry.id, entry.parent_seq, entry.created_at, raw, problem)

    # -- records -------------------------------------------------------------------------

    async def get_record(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        """See `statekeeper.stores.base.RecordStore.get_record`."""
        return self._open_record(tenant, await self.wrapped.get_record(tenant, namespace, key))

    async def put_record(
        self,
        tenant: str,
        namespace: str,
        key: str,
        value: JsonValue,
        *,
        expected_version: int | None = None,
        expires_at: datetime | None = None,
    ) -> VersionedRecord:
        """See `statekeeper.stores.base.RecordStore.put_record`."""
        check_record_ids(tenant, namespace, key)
        what = f"record {namespace}/{key}"
        text = encode_json(value, what=what, limit=self._limit)
        binding = bindings("record", tenant, namespace, key)
        envelope = self.keyring.seal(text.encode(), binding, deterministic=False)
        stored = await self.wrapped.put_record(
            tenant, namespace, key, {SEALED_KEY: envelope},
            expected_version=expected_version, expires_at=expires_at,
        )  # fmt: skip
        return stored.model_copy(update={"value": loads(text)})

    async def list_records(
        self,
        tenant: str,
        namespace: str,
        *,
        prefix: str = "",
        after_key: str | None = None,
        limit: int = 100,
    ) -> RecordList:
        """See `statekeeper.stores.base.RecordStore.list_records`."""
        records = await self.wrapped.list_records(
            tenant, namespace, prefix=prefix, after_key=after_key, limit=limit
        )
        opened: list[VersionedRecord] = []
        corrupt = list(records.corrupt)
        for record in records:
            try:
                opened.append(self._open_record(tenant, record))
            except StateTamperedError as exc:
                if isinstance(exc, WrongKeyError):
                    raise
                corrupt.append(
                    CorruptItem(id=record.key, error=str(exc), raw=str(record.value)[:200])
                )
        return RecordList(opened, corrupt)

    async def delete_record(
        self, tenant: str, namespace: str, key: str, *, expected_version: int | None = None
    ) -> None:
        """See `statekeeper.stores.base.RecordStore.delete_record`."""
        await self.wrapped.delete_record(tenant, namespace, key, expected_version=expected_version)

    def _open_record(self, tenant: str, record: VersionedRecord) -> VersionedRecord:
        envelope = sealed_text(record.value)
        if envelope is None:
            if self.allow_plain:
                return record
            raise StateTamperedError(
                f"record {record.namespace}/{record.key} is stored unsealed, but this store "
                "seals records: refusing it. Open the store with allow_plain=True until "
                "`statekeeper reseal` has sealed the rows written before encryption"
            )
        binding = bindings("record", tenant, record.namespace, record.key)
        try:
            value = loads(self.keyring.open(envelope, binding))
        except StateTamperedError as exc:
            raise type(exc)(f"record {record.namespace}/{record.key}: {exc}") from None
        return record.model_copy(update={"value": value})

    # -- event logs ----------------------------------------------------------------------

    async def append_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft]
    ) -> list[Event]:
        """See `statekeeper.stores.base.EventLogStore.append_events`."""
        check_record_ids(tenant, log_id)
        texts, drafts = self._seal_events(tenant, log_id, events)
        return _opened(await self.wrapped.append_events(tenant, log_id, drafts), texts)

    def _seal_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft]
    ) -> tuple[list[str], list[EventDraft]]:
        """The events' payloads as JSON text, and the drafts to store (sealed)."""
        texts: list[str] = []
        drafts: list[EventDraft] = []
        for event in events:
            text, payload = self.seal_event(tenant, log_id, event, event.payload)
            texts.append(text)
            drafts.append(event.model_copy(update={"payload": payload}))
        return texts, drafts

    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        """See `statekeeper.stores.base.EventLogStore.read_events`."""
        events = await self.wrapped.read_events(tenant, log_id, after_seq=after_seq, limit=limit)
        return [self._open_event(tenant, e) for e in events]

    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        """See `statekeeper.stores.base.EventLogStore.delete_event_log`."""
        await self.wrapped.delete_event_log(tenant, log_id)

    def seal_event(
        self, tenant: str, log_id: str, event: Event | EventDraft, payload: Any
    ) -> tuple[str, dict[str, Any]]:
        """An event payload's JSON and its stored form (used by appends and by reseal)."""
        text = encode_json(payload, what=f"event {event.stream}/{event.kind}", limit=self._limit)
        binding = bindings("event", tenant, log_id, event.stream, event.kind, to_micros(event.ts))
        return text, {SEALED_KEY: self.keyring.seal(text.encode(), binding, deterministic=False)}

    def _open_event(self, tenant: str, event: Event) -> Event:
        envelope = sealed_text(event.payload)
        if envelope is None:
            if (event.stream, event.kind) == ("error", "corrupt") or self.allow_plain:
                return event  # the backend's own stand-in, or a row from before sealing
            return _corrupt_event(event, "it is stored unsealed, but this store seals events")
        binding = bindings(
            "event", tenant, event.log_id, event.stream, event.kind, to_micros(event.ts)
        )
        try:
            text = self.keyring.open(envelope, binding)
        except StateTamperedError as exc:
            if type(exc) is not StateTamperedError:  # WrongKeyError: never a stand-in
                raise
            return _corrupt_event(event, str(exc))
        return Event(event.log_id, event.seq, event.stream, event.kind, event.ts, loads(text))


_entry = partial(tuple.__new__, Entry)
"""Entry from a tuple of its fields, without the checks namedtuple._make does."""


def _corrupt_event(event: Event, problem: str) -> Event:
    # The shape backends give an event row they cannot decode.
    payload = {"error": f"corrupt event: {problem}", "raw": str(event.payload)[:200]}
    return Event(event.log_id, event.seq, "error", "corrupt", event.ts, payload)


def sealed(
    store: Store,
    keyring: Keyring,
    *,
    clear_metadata: Iterable[str] = (),
    allow_plain: bool = False,
) -> SealedStore:
    """``store`` with its tenants' data sealed at rest (see `SealedStore`)."""
    if isinstance(store, SealedStore):
        raise InvalidInputError("this store is sealed already; wrap the plain store once")
    return SealedStore(store, keyring, clear_metadata=clear_metadata, allow_plain=allow_plain)


def _opened(stored: Sequence[Event], texts: Sequence[str]) -> list[Event]:
    """Events as stored (sealed), with the payloads they were sealed from."""
    return [
        Event(e.log_id, e.seq, e.stream, e.kind, e.ts, loads(text))
        for e, text in zip(stored, texts, strict=True)
    ]
