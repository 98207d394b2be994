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

from statekeeper.errors import PayloadTooLargeError
from statekeeper.stores.base import SessionRecord
from statekeeper.stores.engine import EventWrite, Snapshot, Write
from statekeeper.stores.redis.base import (
    RedisBase,
    decode_entry,
    encode_entry,
    to_bytes,
    to_text,
    us,
)
from statekeeper.stores.redis.records import EVENT_NOTICES_KEPT
from statekeeper.stores.redis.scripts import COMMIT, COMMIT_EVENTS
from statekeeper.stores.rules import decode_session, session_not_found

__all__ = ["RedisHeads"]


class RedisHeads:
    """Session heads of one Redis store handle, as the append engine reads and commits them."""

    def __init__(self, base: RedisBase) -> None:
        self._base = base

    def decode(self, tenant: str, session_id: str, doc: bytes | str) -> SessionRecord:
        """A stored head; `StoreCorruptError` (naming the id and the fix) if it cannot be
        decoded."""
        return decode_session(tenant, session_id, doc, f"Redis {self._base.url}")

    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        """The stored head and the stored entries among ``ids`` (one atomic read)."""
        found = await self._script(tenant, session_id, (b"", 0), None, ids)
        assert found is not None
        return found

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
        ``events`` are appended by the same script (`COMMIT_EVENTS`): atomically."""
        token = base.token
        assert isinstance(token, bytes)
        stored = [(w.entry.seq, w.entry.id, encode_entry(w.entry, w.text)) for w in writes]
        return await self._script(
            tenant, session_id, (token, base.record.version), head, ids, stored, events
        )

    async def _script(
        self,
        tenant: str,
        session_id: str,
        base: tuple[bytes, int],
        record: SessionRecord | None,
        ids: Sequence[str] = (),
        entries: Sequence[tuple[int, str, bytes]] = (),
        events: Sequence[EventWrite] = (),
    ) -> Snapshot | None:
        """Run ``commit``: None when written, else the current state. None ``record``: read."""

        doc = record.model_dump_json() if record is not None else ""
        limit = self._base.max_payload_bytes
        if len(doc) > limit:
            raise PayloadTooLargeError(
                f"session {session_id!r} record would be {len(doc)} bytes; the limit is {limit}"
            )
        args: list[Any] = [
            base[0],
            base[1],
            record.version if record is not None else 0,
            doc,
            us(record.last_active) if record is not None else 0,
            session_id,
            len(ids),
            *ids,
        ]
        if events:
            args.append(len(entries))
        for write in entries:
            args += write
        keys = self._base.keys.session_keys(tenant, session_id)
        script = COMMIT
        if events:
            script = COMMIT_EVENTS
            keys.append(self._base.keys.event_notices(tenant))
            for log in events:
                keys.append(self._base.keys.events(tenant, log.log_id))
                args += [log.log_id, EVENT_NOTICES_KEPT, len(log.drafts)]
                for draft, text in zip(log.drafts, log.texts, strict=True):
                    args += [draft.stream, draft.kind, us(draft.ts), text]
        reply = await self._base._run(script, keys, args)
        if reply[0] == 1:
            for log, first in zip(events, reply[1:], strict=True):
                log.stored(int(first))
            return None
        if reply[0] == 0:
            raise session_not_found(session_id)
        generation = to_bytes(reply[1])
        current = self.decode(tenant, session_id, reply[2])
        found = {
            to_text(reply[i]): decode_entry(to_bytes(reply[i + 2]), int(reply[i + 1]))
            for i in range(3, len(reply), 3)
        }
        return Snapshot(generation, current, found)
