"""The append engine's primitives for Redis: one atomic read and one compare-and-set commit.

A change (an append, an update) is planned in Python by `statekeeper.stores.engine`
against a head, and committed by the ``commit`` script only if the stored head still has
the generation and version it was planned from, and no id it assumed new is stored.
Otherwise the script returns the current head and the stored drafts, and the engine plans
the change again from them. The generation is the engine's token: a random value set
when the session is created.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from statekeeper.jsoncodec import loads
from statekeeper.stores.base import SessionRecord
from statekeeper.stores.engine import EventWrite, Snapshot, Write
from statekeeper.stores.redis.base import (
    decode_entry,
    encode_entry,
    to_bytes,
    to_text,
    us,
)
from statekeeper.stores.redis.records import EVENT_NOTICES_KEPT, RedisRecords
from statekeeper.stores.redis.scripts import (
    COMMIT,
    COMMIT_EVENTS,
    LOAD,
    SETTLE,
)
from statekeeper.stores.redis.wire import ScriptArg
from statekeeper.stores.rules import (
    decode_session,
    document_fields,
    encoded_head,
    from_micros,
    same_document,
    session_not_found,
)

__all__ = ["LIVE", "RedisHeads", "live_fields"]

LIVE = (
    "version",
    "last_active",
    "head_seq",
    "last_seq",
    "message_count",
    "total_tokens",
    "fresh_tokens",
)
"""The head fields every append changes. An append that changes no other field stores
these alone (the head's ``live`` field, a JSON array of integers in this order, the time
in microseconds) and leaves the stored document as it was."""
DOC_FIELDS = document_fields(LIVE)


def live_fields(text: bytes) -> dict[str, Any]:
    """The fields a stored ``live`` array holds; `ValueError` if it is damaged."""
    values = loads(text)
    if type(values) is not list or len(values) != len(LIVE):
        raise ValueError(f"its live fields {text[:80]!r} are not {len(LIVE)} numbers")
    if not all(type(v) is int and v >= 0 for v in values):
        raise ValueError(f"its live fields {text[:80]!r} are not counts")
    fields = dict(zip(LIVE, values, strict=True))
    fields["last_active"] = from_micros(fields["last_active"])
    return fields


class RedisHeads:
    """Session heads of one Redis store handle, as the append engine reads and commits them."""

    KEYS_KEPT = 4096
    """Sessions whose key names are kept (all are dropped when there are more)."""

    def __init__(self, base: RedisRecords) -> None:
        self._base = base
        self._keys: dict[tuple[str, str], tuple[str, ...]] = {}

    def decode(self, tenant: str, session_id: str, stored: bytes | str) -> SessionRecord:
        """A stored head, as the scripts read it: its document, then (after a newline)
        its live fields if they moved since the document was written. `StoreCorruptError`
        (naming the id and the fix) if it cannot be decoded."""
        text = to_bytes(stored)
        doc, newline, live = text.rpartition(b"\n")  # compact JSON holds no newline
        if not newline:
            return self.decode_parts(tenant, session_id, text, None)
        return self.decode_parts(tenant, session_id, doc, live)

    def decode_parts(
        self, tenant: str, session_id: str, doc: bytes | str, live: bytes | None
    ) -> SessionRecord:
        """A stored head from its document and its live fields (None: the document is
        current)."""
        where = f"Redis {self._base.url}"
        if live is None:
            return decode_session(tenant, session_id, doc, where)
        return decode_session(tenant, session_id, doc, where, lambda: live_fields(live))

    @staticmethod
    def stored(base: SessionRecord, head: SessionRecord, limit: int) -> str:
        """What a commit stores for ``head`` over ``base``: its live fields when nothing
        else changed (the stored document stays), else its whole document."""
        if same_document(base, head, DOC_FIELDS):
            values = [getattr(head, name) for name in LIVE]
            values[1] = us(head.last_active)
            return "[" + ",".join(map(str, values)) + "]"
        return encoded_head(head, limit)

    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        """The stored head and the stored entries among ``ids`` (one atomic read)."""
        # Generation '' matches no head: the script only reads and answers the snapshot.
        args: list[ScriptArg] = [b"", 0, 0, "", 0, session_id, len(ids), *ids, 0]
        reply = await self._base._run(LOAD, self._session_keys(tenant, session_id), args)
        return await self._settled(tenant, session_id, self._current(tenant, session_id, reply))

    async def commit_head(
        self,
        tenant: str,
        session_id: str,
        base: Snapshot,
        head: SessionRecord,
        writes: Sequence[Write],
        ids: Sequence[str],
        *,
        events: Sequence[EventWrite] = (),
    ) -> Snapshot | None:
        """Write ``head`` and ``writes`` over ``base``; None, or the current snapshot.

        One ``commit`` script call, the arguments in the order it reads them (see there).
        The ids to check that are not the written entries' own go first; usually none.
        ``events`` are appended by the same script (``commit_events``): atomically.
        """
        token = base.token
        assert isinstance(token, bytes)
        doc = self.stored(base.record, head, self._base.max_payload_bytes)
        written = {w.entry.id for w in writes}
        extra = [i for i in ids if i not in written]
        args: list[ScriptArg] = [token, base.record.version, head.version, doc]
        args += (us(head.last_active), session_id, len(extra), *extra, len(writes))
        for w in writes:
            args += (w.entry.seq, w.entry.id, encode_entry(w.entry, w.text))
        if self._base.cluster:
            return await self._commit_spread(tenant, session_id, head, args, events)
        if not events:
            return await self._commit(tenant, session_id, args)
        names = self._base.keys
        keys = [*self._session_keys(tenant, session_id), names.event_notices(tenant)]
        for log in events:
            keys.append(names.events(tenant, log.log_id))
            args += (log.log_id, EVENT_NOTICES_KEPT, len(log.drafts))
            for draft, text in zip(log.drafts, log.texts, strict=True):
                args += (draft.stream, draft.kind, us(draft.ts), text)
        reply = await self._base._run(COMMIT_EVENTS, tuple(keys), args)
        if isinstance(reply, list) and reply[0] == 1:
            for log, first in zip(events, reply[1:], strict=True):
                log.stored(int(first))
            return None
        return await self._settled(tenant, session_id, self._current(tenant, session_id, reply))

    async def _commit_spread(
        self,
        tenant: str,
        session_id: str,
        head: SessionRecord,
        args: list[ScriptArg],
        events: Sequence[EventWrite],
    ) -> Snapshot | None:
        """A commit on a cluster: the entries and head in their slot, then the events and
        the index in the tenant's, in that order (`statekeeper.stores.redis.cluster`)."""
        current = await self._commit(tenant, session_id, args)
        if current is not None:
            return current
        for log in events:
            log.stored(await self._base._log_events(tenant, log.log_id, log.drafts, log.texts))
        await self._base._index(tenant, "touch", session_id, head.last_active)
        return None

    def _session_keys(self, tenant: str, session_id: str) -> tuple[str, ...]:
        keys = self._keys.get((tenant, session_id))
        if keys is None:  # built once per session: every append names the same four
            if len(self._keys) >= self.KEYS_KEPT:
                self._keys.clear()
            keys = tuple(self._base.keys.session_keys(tenant, session_id))
            self._keys[tenant, session_id] = keys
        return keys

    async def _commit(self, tenant: str, session_id: str, args: list[ScriptArg]) -> Snapshot | None:
        """Run ``commit``: None when written, else the current state."""
        reply = await self._base._run(COMMIT, self._session_keys(tenant, session_id), args)
        if reply == 1:
            return None
        return await self._settled(tenant, session_id, self._current(tenant, session_id, reply))

    async def _settled(self, tenant: str, session_id: str, found: Snapshot) -> Snapshot:
        """``found``, once replicas hold its stored entries when the store waits for
        replicas: an append may be acknowledged as a replay of them (no write, so no
        WAIT of its own), and the call that wrote them may have failed its WAIT."""
        if found.existing and self._base.wait is not None:
            await self._base._run(SETTLE, [self._base.keys.settled(tenant, session_id)], [])
        return found

    def _current(self, tenant: str, session_id: str, reply: Any) -> Snapshot:
        """The state a commit script answered instead of writing (nothing was written)."""
        if reply[0] == 0:
            raise session_not_found(session_id)
        generation = to_bytes(reply[1])
        current = self.decode(tenant, session_id, reply[2])
        found = {
            to_text(reply[i]): decode_entry(to_bytes(reply[i + 2]), int(reply[i + 1]))
            for i in range(3, len(reply), 3)
        }
        return Snapshot(generation, current, found)
