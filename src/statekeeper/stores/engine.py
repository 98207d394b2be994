"""The append engine: how every backend changes a session head, written once.

A backend supplies two primitives (`HeadBackend`):

- ``load_head(tenant, session_id, ids)``: the stored head and, among ``ids``, the entries
  already stored, read atomically (a `Snapshot`);
- ``commit_head(tenant, session_id, base, head, writes, ids, events=...)``: in one atomic
  step, check that the stored head is still ``base`` (same token, same version) and that
  none of ``ids`` is stored yet, then write ``head``, the new entries and the events of
  ``events`` (each `EventWrite` with the next seqs of its log, in order; the backend
  fills `EventWrite.logged`). It returns None when it wrote, or the current `Snapshot`
  when the check failed (nothing written, no event logged).

The engine does the rest, the same way for all of them:

- a **head cache** per session (what this handle last committed or read), so the usual
  append plans against it and commits in one round trip, with the backend's check proving
  the cache current (**the fast path**);
- **plan and checks** with the pure rules (`rules.plan_append`, `rules.apply_patch`);
- **the careful fallback**: when the check fails, plan again from the snapshot the commit
  returned, until a commit lands or the plan itself refuses;
- **idempotent replay**: a retried append whose entries are all stored identically is
  answered from the stored entries (`AppendResult.replayed`), never written twice; an
  error is only reported against a head the backend returned, never a cached one;
- **group commit**: changes to one session that arrive while this handle is committing to
  it are planned in turn and committed together, each with its own result or error.

A backend's token tells two incarnations of a session apart (a row key, a random
generation): versions restart at 1 when a session is deleted and created again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from statekeeper.core.messages import utcnow
from statekeeper.core.typed import trusted
from statekeeper.ids import validate_id
from statekeeper.stores.base import (
    AppendResult,
    Entry,
    EntryDraft,
    EventBatch,
    SessionPatch,
    SessionRecord,
)
from statekeeper.stores.engine_types import EventWrite, HeadBackend, Planned, Snapshot, Write
from statekeeper.stores.fifo_lock import FifoLock
from statekeeper.stores.rules import (
    apply_patch,
    check_session_record,
    check_version,
    event_texts,
    plan_append,
)

__all__ = [
    "AppendEngine",
    "EventWrite",
    "HeadBackend",
    "Planned",
    "Snapshot",
    "Write",
]

_MAX_CACHED_HEADS = 10_000


Plan = Callable[[SessionRecord, dict[str, Entry]], Planned]
"""Plans a change against (head, stored entries by id); raises if the change is refused.
Returns ``Planned(head)`` with the same head object when it writes nothing (a replay)."""


@dataclass(eq=False, slots=True)
class _Change:
    plan: Plan
    ids: Sequence[str]
    done: asyncio.Future[Any]


class _Slot(FifoLock):
    """The writes of one session through this handle: the lock held by the writer whose
    change is being committed, and the changes queued behind it. Reused (every append
    takes one)."""

    __slots__ = ("queue", "users")

    def __init__(self) -> None:
        super().__init__()
        self.queue: list[_Change] = []
        self.users = 0


_SPARE_SLOTS = 64


class AppendEngine:
    """Appends and head updates of one store handle, over a backend's two primitives."""

    def __init__(
        self,
        backend: HeadBackend,
        *,
        max_payload_bytes: int,
        heads: dict[tuple[str, str], tuple[Hashable, SessionRecord]] | None = None,
    ) -> None:
        self._backend = backend
        self.max_payload_bytes = max_payload_bytes
        # (tenant, id) -> (token, head) as this handle last committed or read it. The
        # engines of one store on several loops share it (`heads`): an entry is a head
        # that was stored, and every commit checks the head it planned from anyway.
        self.heads: dict[tuple[str, str], tuple[Hashable, SessionRecord]] = (
            {} if heads is None else heads
        )
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._spare: list[_Slot] = []  # released slots, reused

    # -- the head cache ------------------------------------------------------------------

    def remember(self, tenant: str, token: Hashable, record: SessionRecord) -> None:
        """Cache a head known to be stored (it may go stale: commits check it)."""
        key = (tenant, record.id)
        known = self.heads.get(key)
        if known is not None and known[0] == token and known[1].version > record.version:
            return  # a later commit of this handle already landed
        if known is None and len(self.heads) >= _MAX_CACHED_HEADS:
            # Another loop's engine may change the dict meanwhile: evicting is best effort.
            with contextlib.suppress(RuntimeError, KeyError, StopIteration):
                del self.heads[next(iter(self.heads))]
        self.heads[key] = (token, record)

    def forget(self, tenant: str, session_id: str) -> None:
        """Drop a cached head (deleted, or no longer trusted)."""
        self.heads.pop((tenant, session_id), None)

    def cached(self, tenant: str, session_id: str) -> tuple[Hashable, SessionRecord] | None:
        """The cached (token, head) of a session, if any."""
        return self.heads.get((tenant, session_id))

    # -- the two operations --------------------------------------------------------------

    def append(
        self,
        tenant: str,
        session_id: str,
        drafts: Sequence[EntryDraft],
        *,
        expected_version: int | None,
        patch: SessionPatch | None,
        move_head: bool,
        events: EventBatch | None = None,
    ) -> Awaitable[AppendResult]:
        """`TranscriptStore.append_entries`, for any backend (to be awaited at once).

        Not a coroutine itself, nor is `submit`: every append waits for its commit
        through as few frames as can be, each one an object the collector counts."""
        logged: EventWrite | None = None
        if events is not None:
            # Checked before anything is planned or written, as append_events checks them.
            texts = event_texts(tenant, events.log_id, events.events, self.max_payload_bytes)
            if texts:
                logged = EventWrite(events.log_id, events.events, texts)
        plan = _AppendPlan(
            drafts, expected_version, patch, move_head, self.max_payload_bytes, logged
        )
        # Checked before anything is read with them (a backend may refuse them untyped).
        ids = [validate_id(d.id, "entry id") for d in drafts]
        return self.submit(tenant, session_id, plan, ids)

    async def update(
        self,
        tenant: str,
        session_id: str,
        patch: SessionPatch,
        *,
        expected_version: int | None,
    ) -> SessionRecord:
        """`SessionStore.update_session`, for any backend."""
        limit = self.max_payload_bytes

        def plan(record: SessionRecord, existing: dict[str, Entry]) -> Planned:
            check_version(record, expected_version)
            updated = apply_patch(record, patch, now=utcnow())
            if patch.set:
                check_session_record(updated, limit)
            return Planned(updated, result=updated)

        updated: SessionRecord = await self.submit(tenant, session_id, plan, ())
        return updated

    # -- group commit --------------------------------------------------------------------

    @asynccontextmanager
    async def serial(self, tenant: str, session_id: str) -> AsyncIterator[None]:
        """Hold the lock that orders this handle's writes to a session (for pruning)."""
        key = (tenant, session_id)
        slot = self._slot(key)
        try:
            await slot.acquire()
            try:
                yield
            finally:
                slot.release()
        finally:
            self._release(key, slot)

    def _slot(self, key: tuple[str, str]) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = self._spare.pop() if self._spare else _Slot()
        slot.users += 1
        return slot

    def _release(self, key: tuple[str, str], slot: _Slot) -> None:
        slot.users -= 1
        if not slot.users and self._slots.get(key) is slot:
            del self._slots[key]
            idle = not (slot.busy or slot.waiters or slot.queue)
            if idle and len(self._spare) < _SPARE_SLOTS:  # only a clean slot is reused
                self._spare.append(slot)

    def submit(
        self, tenant: str, session_id: str, plan: Plan, ids: Sequence[str]
    ) -> Awaitable[Any]:
        """Plan and commit a change (batched with concurrent ones); await its result."""
        if (tenant, session_id) not in self._slots:
            return self._apply_alone(tenant, session_id, plan, ids)
        return self._queued(tenant, session_id, plan, ids)

    async def _queued(self, tenant: str, session_id: str, plan: Plan, ids: Sequence[str]) -> Any:
        """`submit` while this handle writes the session: queue the change behind the
        lock; whoever takes the lock commits what is queued."""
        key = (tenant, session_id)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # A batch may finish after its leader was cancelled: nobody reads that result.
        done.add_done_callback(_consume)
        change = _Change(plan, ids, done)
        slot = self._slot(key)
        slot.queue.append(change)  # before waiting: the holder of the lock may batch it
        try:
            await slot.acquire()
            held = True
            try:
                if slot.queue and not done.done():
                    batch, slot.queue = slot.queue, []
                    if len(batch) == 1:
                        await self._apply(tenant, session_id, batch)
                    else:
                        # Other callers wait on this batch: it runs to its end even if we
                        # are cancelled, and holds the lock until then.
                        task = asyncio.ensure_future(self._apply(tenant, session_id, batch))
                        try:
                            await asyncio.shield(task)
                        except asyncio.CancelledError:
                            if not task.done():
                                held = False
                                self._hand_over(key, slot, task)
                            raise
            finally:
                if held:
                    slot.release()
        except BaseException:
            if change in slot.queue:  # failed or cancelled before anyone planned it: drop it
                slot.queue.remove(change)
                done.cancel()
            raise
        finally:
            self._release(key, slot)
        return await done

    def _hand_over(self, key: tuple[str, str], slot: _Slot, task: asyncio.Future[None]) -> None:
        """Let a running batch hold the lock (and the slot) until it ends: its leader was
        cancelled, and no other commit of this session may start before it has."""
        slot.users += 1

        def finished(_: object) -> None:
            slot.release()
            self._release(key, slot)

        task.add_done_callback(finished)

    async def _apply_alone(
        self, tenant: str, session_id: str, plan: Plan, ids: Sequence[str]
    ) -> Any:
        """`submit` when nobody else writes the session through this handle: no queue,
        no future, and the lock is free (taken without waiting). Callers arriving
        meanwhile find the slot and queue behind its lock."""
        key = (tenant, session_id)
        if key in self._slots:  # taken since `submit` looked (if not awaited at once)
            return await self._queued(tenant, session_id, plan, ids)
        slot = self._slot(key)
        slot.try_acquire()  # a slot nobody holds: always free
        try:
            cached = self._cached_start(tenant, session_id)
            if cached is None:
                state, proved = await self._load(tenant, session_id, ids), True
            else:
                state, proved = cached, False
            while True:
                try:
                    planned = plan(state.record, state.existing)
                except Exception:
                    if proved:
                        raise
                    state, proved = await self._load(tenant, session_id, ids), True
                    continue
                if planned.session is state.record:  # nothing to write (a replay)
                    if proved:
                        return planned.result
                    state, proved = await self._load(tenant, session_id, ids), True
                    continue
                unknown = [i for i in ids if i not in state.existing]
                logs = () if planned.events is None else (planned.events,)
                current = await self._commit(
                    tenant, session_id, state, planned.session, planned.writes, unknown, logs
                )
                if current is None:
                    return planned.outcome()
                state, proved = current, True
        finally:
            slot.release()
            self._release(key, slot)

    async def _apply(self, tenant: str, session_id: str, batch: list[_Change]) -> None:
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

    async def _apply_batch(self, tenant: str, session_id: str, batch: list[_Change]) -> None:
        ids = list(dict.fromkeys(i for change in batch for i in change.ids))
        state, proved = await self._start(tenant, session_id, ids)
        while True:
            head, known = state.record, dict(state.existing)
            outcomes: list[tuple[_Change, Planned | Exception]] = []
            writes: list[Write] = []
            logs: list[EventWrite] = []
            for change in batch:
                if change.done.done():
                    continue  # its caller was cancelled before it was planned
                try:
                    planned = change.plan(head, known)
                except Exception as exc:
                    outcomes.append((change, exc))
                    continue
                for write in planned.writes:
                    known[write.entry.id] = write.entry
                writes.extend(planned.writes)
                if planned.events is not None:
                    logs.append(planned.events)
                head = planned.session
                outcomes.append((change, planned))
            if head is state.record:
                if not proved:  # nothing to write, judged on a cached head: check it
                    state, proved = await self._load(tenant, session_id, ids), True
                    continue
            else:
                unknown = [i for i in ids if i not in state.existing]
                current = await self._commit(tenant, session_id, state, head, writes, unknown, logs)
                if current is not None:
                    state, proved = current, True
                    continue
            for change, outcome in outcomes:
                if not change.done.done():
                    if isinstance(outcome, Planned):
                        change.done.set_result(outcome.outcome())
                    else:
                        change.done.set_exception(outcome)
            return

    async def _start(
        self, tenant: str, session_id: str, ids: Sequence[str]
    ) -> tuple[Snapshot, bool]:
        """The head to plan from: the cached one (not proved current), else the stored one.

        Errors count only against a proved head, one the backend returned.
        """
        cached = self._cached_start(tenant, session_id)
        if cached is None:
            return await self._load(tenant, session_id, ids), True
        return cached, False

    def _cached_start(self, tenant: str, session_id: str) -> Snapshot | None:
        """`_start`'s cached head, if any (the usual append: no coroutine to await)."""
        cached = self.heads.get((tenant, session_id))
        return None if cached is None else Snapshot(cached[0], cached[1], {})

    async def _load(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        try:
            state = await self._backend.load_head(tenant, session_id, ids)
        except Exception:
            self.forget(tenant, session_id)
            raise
        self.remember(tenant, state.token, state.record)
        return state

    async def _commit(
        self,
        tenant: str,
        session_id: str,
        base: Snapshot,
        head: SessionRecord,
        writes: Sequence[Write],
        ids: Sequence[str],
        events: Sequence[EventWrite] = (),
    ) -> Snapshot | None:
        try:
            if events:
                current = await self._backend.commit_head(
                    tenant, session_id, base, head, writes, ids, events=events
                )
            else:  # the usual call, as every backend has always taken it
                current = await self._backend.commit_head(
                    tenant, session_id, base, head, writes, ids
                )
        except Exception:
            self.forget(tenant, session_id)
            raise
        if current is None:
            self.remember(tenant, base.token, head)
        else:
            self.remember(tenant, current.token, current.record)
        return current


class _AppendPlan:
    """The `Plan` of an append. An object rather than a closure: every append makes one
    and it lives until the commit, and one object is fewer for the garbage collector to
    count and walk than a function with a cell per variable it uses."""

    __slots__ = ("drafts", "expected_version", "logged", "max_payload_bytes", "move_head", "patch")

    def __init__(
        self,
        drafts: Sequence[EntryDraft],
        expected_version: int | None,
        patch: SessionPatch | None,
        move_head: bool,
        max_payload_bytes: int,
        logged: EventWrite | None,
    ) -> None:
        self.drafts = drafts
        self.expected_version = expected_version
        self.patch = patch
        self.move_head = move_head
        self.max_payload_bytes = max_payload_bytes
        self.logged = logged

    def __call__(self, record: SessionRecord, existing: dict[str, Entry]) -> Planned:
        patch, drafts, limit = self.patch, self.drafts, self.max_payload_bytes
        planned = plan_append(
            record,
            drafts,
            existing,
            expected_version=self.expected_version,
            patch=patch,
            move_head=self.move_head,
            max_payload_bytes=limit,
            now=utcnow(),
        )
        if planned.replayed:
            # Its events were logged with the first attempt: never twice.
            replay = AppendResult(session=record, entries=planned.replayed, replayed=True)
            return Planned(record, result=replay)
        if patch is not None and patch.set:
            check_session_record(planned.session, limit)
        # Every draft is new when anything is written (plan_append refuses a mix).
        writes = [
            Write(entry, text, draft.side)
            for entry, text, draft in zip(planned.entries, planned.encoded, drafts, strict=True)
        ]
        # Built from checked parts: nothing to validate again.
        result = trusted(
            AppendResult,
            {
                "session": planned.session,
                "entries": planned.entries,
                "replayed": False,
                "events": [],
            },
        )
        return Planned(planned.session, writes, result, self.logged)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
