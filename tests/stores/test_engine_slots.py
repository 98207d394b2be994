"""The engine's per-session lock (`FifoLock`): first come, first served, and cancellation never
leaves it held (a held lock would stall every later write to that session)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from statekeeper.stores.base import EntryDraft, SessionRecord
from statekeeper.stores.engine import AppendEngine, EventWrite, Snapshot, Write
from statekeeper.stores.fifo_lock import FifoLock as Slot


async def test_waiters_take_the_lock_in_arrival_order_and_cancelled_ones_are_skipped() -> None:
    slot = Slot()
    await slot.acquire()  # free: taken at once
    order: list[int] = []

    async def take(n: int) -> None:
        await slot.acquire()
        order.append(n)
        slot.release()

    tasks = [asyncio.create_task(take(n)) for n in range(4)]
    await asyncio.sleep(0)  # every task is now waiting
    tasks[1].cancel()
    slot.release()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert order == [0, 2, 3]
    assert not slot.busy
    assert not slot.waiters


async def test_a_waiter_cancelled_after_being_handed_the_lock_passes_it_on() -> None:
    slot = Slot()
    await slot.acquire()
    first = asyncio.create_task(slot.acquire())
    second = asyncio.create_task(slot.acquire())
    await asyncio.sleep(0)
    slot.release()  # handed to ``first``, which has not run yet
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert first.cancelled()
    await asyncio.wait_for(second, 5)  # got the lock ``first`` passed on
    assert slot.busy
    slot.release()
    assert not slot.busy


class _Gated:
    """A backend whose commits wait until the test opens the gate."""

    def __init__(self) -> None:
        self.record = SessionRecord(tenant="t", id="s", version=1)
        self.gate = asyncio.Event()
        self.commits: list[list[str]] = []

    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        return Snapshot(1, self.record, {})

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
        await self.gate.wait()
        if base.record.version != self.record.version:
            return Snapshot(1, self.record, {})
        self.record = head
        self.commits.append([w.entry.id for w in writes])
        return None


def _draft(entry_id: str) -> EntryDraft:
    return EntryDraft(id=entry_id, payload={"n": entry_id})


async def _append(engine: AppendEngine, entry_id: str) -> int:
    result = await engine.append(
        "t", "s", [_draft(entry_id)], expected_version=None, patch=None, move_head=True
    )
    return result.entries[0].seq


async def test_a_writer_cancelled_while_committing_alone_frees_the_session() -> None:
    backend = _Gated()
    engine = AppendEngine(backend, max_payload_bytes=1 << 20)
    alone = asyncio.create_task(_append(engine, "a"))
    await asyncio.sleep(0)  # holds the lock, waiting in commit
    alone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await alone
    backend.gate.set()
    assert await asyncio.wait_for(_append(engine, "b"), 5) == 1
    assert backend.commits == [["b"]]


async def test_writers_queued_behind_a_commit_are_committed_together_in_order() -> None:
    backend = _Gated()
    engine = AppendEngine(backend, max_payload_bytes=1 << 20)
    first = asyncio.create_task(_append(engine, "a"))
    await asyncio.sleep(0)
    queued = [asyncio.create_task(_append(engine, i)) for i in ("b", "c", "d")]
    await asyncio.sleep(0)
    queued[1].cancel()  # cancelled before anyone planned it: dropped
    backend.gate.set()
    assert await first == 1
    outcomes = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 5)
    assert outcomes[0] == 2
    assert outcomes[2] == 3
    assert isinstance(outcomes[1], asyncio.CancelledError)
    assert backend.commits == [["a"], ["b", "d"]]
    assert await asyncio.wait_for(_append(engine, "e"), 5) == 4  # the lock is free again
