"""Writes to session heads in the Redis store: compare-and-set, retries, group commit.

A change (an append, an update) is planned in Python against a head, and committed by
the ``commit`` script only if the stored head still has the generation and version it
was planned from, and no id it assumed new is stored. Otherwise the script returns the
current head and the stored drafts, and the change is planned again from them; errors
(a stale ``expected_version``, a bad parent) are reported only once they are proved
against a head the server returned, never against this handle's cached copy.

Group commit: the changes to one session made through one handle queue on a lock. The
caller that takes the lock plans every queued change, in arrival order, each on top of
the one before (as if they had run one by one), and commits them all with one script
call; each caller gets its own result or error. One writer pays one round trip per
change; many writers of one session share round trips instead of waiting for each
other's. The batch runs shielded from the cancellation of the caller that took the lock,
so the other callers in it always get an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from statekeeper.errors import PayloadTooLargeError, StoreCorruptError
from statekeeper.stores.base import Entry, SessionRecord
from statekeeper.stores.common import session_not_found
from statekeeper.stores.redis.base import (
    RedisBase,
    decode_entry,
    encode_entry,
    to_bytes,
    to_text,
    us,
)
from statekeeper.stores.redis.scripts import COMMIT

__all__ = ["Change", "HeadWriter", "Planned", "State"]

_MAX_CACHED_HEADS = 10_000

State = tuple[bytes, SessionRecord, dict[str, Entry]]
"""What changes are planned from: (generation, head, stored entries among their ids)."""


@dataclass(frozen=True, slots=True)
class Planned:
    """A change planned against a head: the head after it, what it writes, its result."""

    session: SessionRecord
    entries: Sequence[Entry] = ()
    encoded: Sequence[str] = ()
    result: Any = None


Plan = Callable[[SessionRecord, dict[str, Entry]], Planned]
"""Plans a change against (head, stored entries by id); raises if the change is refused.
Returns ``Planned(head)`` with the same head object when it writes nothing (a replay)."""


@dataclass(eq=False, slots=True)
class Change:
    """One caller's change to a session head, waiting for its batch."""

    plan: Plan
    ids: Sequence[str]
    done: asyncio.Future[Any]


@dataclass(eq=False, slots=True)
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: list[Change] = field(default_factory=list)
    users: int = 0


class HeadWriter:
    """Session heads of one store handle: the cache of heads and the commit path."""

    def __init__(self, base: RedisBase) -> None:
        self._base = base
        # (tenant, id) -> (generation, head) as this handle last wrote or read it.
        self._heads: dict[tuple[str, str], tuple[bytes, SessionRecord]] = {}
        self._slots: dict[tuple[str, str], _Slot] = {}

    def remember(self, tenant: str, generation: bytes, record: SessionRecord) -> None:
        """Cache a head known to be stored (it may go stale: commits check it)."""
        if len(self._heads) >= _MAX_CACHED_HEADS:
            del self._heads[next(iter(self._heads))]
        self._heads[tenant, record.id] = (generation, record)

    def forget(self, tenant: str, session_id: str) -> None:
        self._heads.pop((tenant, session_id), None)

    def decode(self, session_id: str | None, doc: bytes | str) -> SessionRecord:
        """A stored head; `StoreCorruptError` if it cannot be decoded."""
        try:
            return SessionRecord.model_validate_json(doc)
        except ValueError as exc:
            which = "a listed session" if session_id is None else f"session {session_id!r}"
            raise StoreCorruptError(
                f"the record of {which} in Redis {self._base.url} cannot be decoded: {exc}"
            ) from exc

    @asynccontextmanager
    async def serial(self, tenant: str, session_id: str) -> AsyncIterator[_Slot]:
        """Hold the lock that orders this handle's writes to one session."""
        slot = self._slot(tenant, session_id)
        try:
            async with slot.lock:
                yield slot
        finally:
            self._release(tenant, session_id, slot)

    def _slot(self, tenant: str, session_id: str) -> _Slot:
        slot = self._slots.get((tenant, session_id))
        if slot is None:
            slot = self._slots[tenant, session_id] = _Slot()
        slot.users += 1
        return slot

    def _release(self, tenant: str, session_id: str, slot: _Slot) -> None:
        slot.users -= 1
        if not slot.users and self._slots.get((tenant, session_id)) is slot:
            del self._slots[tenant, session_id]

    async def submit(self, tenant: str, session_id: str, plan: Plan, ids: Sequence[str]) -> Any:
        """Plan and commit a change (batched with concurrent ones); its result."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # A batch may finish after its leader was cancelled: nobody reads that result.
        done.add_done_callback(_consume)
        change = Change(plan, ids, done)
        slot = self._slot(tenant, session_id)
        slot.queue.append(change)  # before waiting: the holder of the lock may batch it
        try:
            async with slot.lock:
                if slot.queue and not done.done():
                    batch, slot.queue = slot.queue, []
                    if len(batch) == 1:
                        await self._apply(tenant, session_id, batch)
                    else:
                        await asyncio.shield(self._apply(tenant, session_id, batch))
        except asyncio.CancelledError:
            if change in slot.queue:  # cancelled before anyone planned it: drop it
                slot.queue.remove(change)
                done.cancel()
            raise
        finally:
            self._release(tenant, session_id, slot)
        return await done

    async def _apply(self, tenant: str, session_id: str, batch: list[Change]) -> None:
        """Plan and commit a batch; every change in it gets its result or error."""
        try:
            await self._apply_batch(tenant, session_id, batch)
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else asyncio.CancelledError()
            for change in batch:
                if not change.done.done():
                    change.done.set_exception(failure)
            if not isinstance(exc, Exception):
                raise

    async def _apply_batch(self, tenant: str, session_id: str, batch: list[Change]) -> None:
        ids = list(dict.fromkeys(i for change in batch for i in change.ids))
        cached = self._heads.get((tenant, session_id))
        proved = cached is None  # errors count only against a head the server returned
        state = await self.state(tenant, session_id, ids) if cached is None else (*cached, {})
        while True:
            generation, record, existing = state
            head, known = record, dict(existing)
            outcomes: list[tuple[Change, Any, bool]] = []
            writes: list[tuple[int, str, bytes]] = []
            for change in batch:
                if change.done.done():
                    continue  # its caller was cancelled before it was planned
                try:
                    planned = change.plan(head, known)
                except Exception as exc:
                    outcomes.append((change, exc, False))
                    continue
                for entry, text in zip(planned.entries, planned.encoded, strict=True):
                    writes.append((entry.seq, entry.id, encode_entry(entry, text)))
                    known[entry.id] = entry
                head = planned.session
                outcomes.append((change, planned.result, True))
            if head is record:
                if not proved:
                    state, proved = await self.state(tenant, session_id, ids), True
                    continue
            else:
                unknown = [i for i in ids if i not in existing]
                base = (generation, record.version)
                next_state = await self.commit(tenant, session_id, base, head, unknown, writes)
                if next_state is not None:
                    state, proved = next_state, True
                    continue
            for change, outcome, ok in outcomes:
                if not change.done.done():
                    if ok:
                        change.done.set_result(outcome)
                    else:
                        change.done.set_exception(outcome)
            return

    async def state(self, tenant: str, session_id: str, ids: Sequence[str] = ()) -> State:
        """The stored head and the stored entries among ``ids`` (one atomic read)."""
        found = await self.commit(tenant, session_id, (b"", 0), None, ids)
        assert found is not None
        return found

    async def commit(
        self,
        tenant: str,
        session_id: str,
        base: tuple[bytes, int],
        record: SessionRecord | None,
        ids: Sequence[str] = (),
        entries: Sequence[tuple[int, str, bytes]] = (),
    ) -> State | None:
        """Write ``record`` and ``entries`` (seq, id, stored form) over head ``base``.

        None when written. Otherwise the current state to plan again from: the head
        moved, or one of ``ids`` is stored. A ``record`` of None only reads.
        """
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
        for write in entries:
            args += write
        keys = self._base.keys.session_keys(tenant, session_id)
        reply = await self._base._run(COMMIT, keys, args)
        if reply[0] == 1:
            assert record is not None
            self.remember(tenant, base[0], record)
            return None
        if reply[0] == 0:
            self.forget(tenant, session_id)
            raise session_not_found(session_id)
        generation = to_bytes(reply[1])
        current = self.decode(session_id, reply[2])
        self.remember(tenant, generation, current)
        found = {
            to_text(reply[i]): decode_entry(to_bytes(reply[i + 2]), int(reply[i + 1]))
            for i in range(3, len(reply), 3)
        }
        return generation, current, found


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
