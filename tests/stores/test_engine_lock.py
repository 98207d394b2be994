"""The engine's per-session lock (`FifoLock`) and cancellation: the lock goes to its
waiters first come, first served, and cancelling writers at any point leaves every
session consistent: never two commits of one session in flight, no cancelled change
committed later (or elsewhere), results that match the stored order, every slot
released clean.

Writers are cancelled one at a time and all at once in creation order (as
`asyncio.gather` and `asyncio.TaskGroup` do when they tear down), against a backend that
yields at random points (seeded, so every failure is reproducible by its seed)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from statekeeper.stores.base import Entry, EntryDraft, SessionRecord
from statekeeper.stores.engine import AppendEngine, EventWrite, Snapshot, Write
from statekeeper.stores.fifo_lock import FifoLock


class _Sessions:
    """Many sessions in memory; counts commits in flight per session."""

    def __init__(self, rng: random.Random | None = None, *, gated: bool = False) -> None:
        self.rng = rng
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()
        self.records: dict[str, SessionRecord] = {}
        self.entries: dict[str, dict[str, Entry]] = {}
        self.log: dict[str, list[str]] = {}
        self.commits: list[list[str]] = []  # the entry ids of each commit that wrote
        self.in_flight: dict[str, int] = {}
        self.problems: list[str] = []

    def _record(self, session_id: str) -> SessionRecord:
        if session_id not in self.records:
            self.records[session_id] = SessionRecord(tenant="t", id=session_id, version=1)
        return self.records[session_id]

    async def _yield(self) -> None:
        for _ in range(self.rng.randrange(3) if self.rng else 0):
            await asyncio.sleep(0)

    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        await self._yield()
        stored = self.entries.get(session_id, {})
        return Snapshot(1, self._record(session_id), {i: stored[i] for i in ids if i in stored})

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
        self.in_flight[session_id] = self.in_flight.get(session_id, 0) + 1
        if self.in_flight[session_id] > 1:
            self.problems.append(f"two commits of {session_id} in flight")
        try:
            await self.gate.wait()
            await self._yield()
            current = self._record(session_id)
            stored = self.entries.setdefault(session_id, {})
            if base.record.version != current.version or any(i in stored for i in ids):
                return Snapshot(1, current, {i: stored[i] for i in ids if i in stored})
            self.records[session_id] = head
            self.commits.append([w.entry.id for w in writes])
            for write in writes:
                stored[write.entry.id] = write.entry
                self.log.setdefault(session_id, []).append(write.entry.id)
            return None
        finally:
            self.in_flight[session_id] -= 1


async def _append(engine: AppendEngine, session_id: str, entry_id: str) -> int:
    draft = EntryDraft(id=entry_id, payload={"n": entry_id})
    result = await engine.append(
        "t", session_id, [draft], expected_version=None, patch=None, move_head=True
    )
    return result.entries[0].seq


def _unclean_slots(engine: AppendEngine) -> list[str]:
    found = [f"slot of {key} still held" for key in engine._slots]
    for slot in engine._spare:
        if slot.busy or slot.waiters or slot.queue or slot.users:
            found.append("a reused slot is not clean")
    return found


async def test_waiters_take_the_lock_in_arrival_order_and_cancelled_ones_are_skipped() -> None:
    slot = FifoLock()
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
    slot = FifoLock()
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


async def test_a_writer_cancelled_while_committing_alone_frees_the_session() -> None:
    backend = _Sessions(gated=True)
    engine = AppendEngine(backend, max_payload_bytes=1 << 20)
    alone = asyncio.create_task(_append(engine, "s", "a"))
    await asyncio.sleep(0)  # holds the lock, waiting in commit
    alone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await alone
    backend.gate.set()
    assert await asyncio.wait_for(_append(engine, "s", "b"), 5) == 1
    assert backend.commits == [["b"]]


async def test_writers_queued_behind_a_commit_are_committed_together_in_order() -> None:
    backend = _Sessions(gated=True)
    engine = AppendEngine(backend, max_payload_bytes=1 << 20)
    first = asyncio.create_task(_append(engine, "s", "a"))
    await asyncio.sleep(0)
    queued = [asyncio.create_task(_append(engine, "s", i)) for i in ("b", "c", "d")]
    await asyncio.sleep(0)
    queued[1].cancel()  # cancelled before anyone planned it: dropped
    backend.gate.set()
    assert await first == 1
    outcomes = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 5)
    assert outcomes[0] == 2
    assert outcomes[2] == 3
    assert isinstance(outcomes[1], asyncio.CancelledError)
    assert backend.commits == [["a"], ["b", "d"]]
    assert await asyncio.wait_for(_append(engine, "s", "e"), 5) == 4  # the lock is free again


async def test_a_holder_and_its_waiter_cancelled_together_commit_nothing_anywhere() -> None:
    backend = _Sessions(gated=True)
    engine = AppendEngine(backend, max_payload_bytes=1 << 20)
    holder = asyncio.create_task(_append(engine, "s", "a"))
    await asyncio.sleep(0)  # holds the lock, waiting in its commit
    waiter = asyncio.create_task(_append(engine, "s", "b"))
    await asyncio.sleep(0)  # queued behind it
    holder.cancel()
    waiter.cancel()  # in the same step, as a TaskGroup's teardown does
    outcomes = await asyncio.gather(holder, waiter, return_exceptions=True)
    assert [type(o) for o in outcomes] == [asyncio.CancelledError] * 2
    assert _unclean_slots(engine) == []
    backend.gate.set()
    first = asyncio.create_task(_append(engine, "x", "x1"))
    await asyncio.sleep(0)
    second = asyncio.create_task(_append(engine, "x", "x2"))
    assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [1, 2]
    assert backend.log == {"x": ["x1", "x2"]}


async def test_a_batch_whose_leader_is_cancelled_keeps_the_session_until_it_ends() -> None:
    backend = _Sessions(gated=True)
    engine = AppendEngine(backend, max_payload_bytes=1 << 20)
    first = asyncio.create_task(_append(engine, "s", "a"))
    await asyncio.sleep(0)  # in its commit
    leader = asyncio.create_task(_append(engine, "s", "b"))
    member = asyncio.create_task(_append(engine, "s", "c"))
    await asyncio.sleep(0)  # both queued
    first.cancel()
    for _ in range(3):
        await asyncio.sleep(0)  # the leader takes the lock and commits [b, c]
    late = asyncio.create_task(_append(engine, "s", "d"))
    await asyncio.sleep(0)
    leader.cancel()  # the batch goes on: ``member`` waits for it
    for _ in range(3):
        await asyncio.sleep(0)
    assert backend.in_flight["s"] == 1  # ``late`` has not started a commit beside it
    backend.gate.set()
    outcomes = await asyncio.wait_for(
        asyncio.gather(first, leader, member, late, return_exceptions=True), 5
    )
    assert isinstance(outcomes[0], asyncio.CancelledError)
    assert isinstance(outcomes[1], asyncio.CancelledError)
    assert outcomes[2:] == [2, 3]
    assert backend.log == {"s": ["b", "c", "d"]}
    assert backend.problems == []
    assert _unclean_slots(engine) == []


async def _writers_cancelled_at_random(seed: int) -> list[str]:
    rng = random.Random(seed)
    backend = _Sessions(rng)
    engine = AppendEngine(backend, max_payload_bytes=1 << 20)
    sessions = [f"s{i}" for i in range(rng.randint(1, 3))]
    arrived: dict[str, list[str]] = {}
    results: dict[str, tuple[str, int]] = {}

    async def writer(n: int) -> None:
        session_id = rng.choice(sessions)
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
        entry_id = f"{session_id}-{n}"
        arrived.setdefault(session_id, []).append(entry_id)
        results[entry_id] = (session_id, await _append(engine, session_id, entry_id))

    async def pruner() -> None:
        session_id = rng.choice(sessions)
        async with engine.serial("t", session_id):
            for _ in range(rng.randrange(3)):
                if backend.in_flight.get(session_id):
                    backend.problems.append(f"a commit of {session_id} during serial()")
                await asyncio.sleep(0)

    tasks: list[asyncio.Task[None]] = []
    for n in range(rng.randint(5, 40)):
        tasks.append(asyncio.create_task(pruner() if rng.random() < 0.1 else writer(n)))
        if rng.random() < 0.3:
            await asyncio.sleep(0)
        if rng.random() < 0.15:
            rng.choice(tasks).cancel()
        if rng.random() < 0.03:
            for task in tasks:
                task.cancel()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    problems = list(backend.problems)
    for session_id, log in backend.log.items():
        if any(not e.startswith(session_id + "-") for e in log):
            problems.append(f"an entry stored in the wrong session: {log}")
        if [e for e in arrived.get(session_id, []) if e in log] != log:
            problems.append(f"{session_id} not committed in arrival order")
    for entry_id, (session_id, seq) in results.items():
        if backend.log.get(session_id, []).index(entry_id) + 1 != seq:
            problems.append(f"{entry_id} was answered seq {seq}")
    return problems + _unclean_slots(engine)


@pytest.mark.parametrize("seeds", [range(0, 100), range(100, 200)])
async def test_writers_cancelled_at_random_leave_every_session_consistent(
    seeds: range,
) -> None:
    failures = {seed: p for seed in seeds if (p := await _writers_cancelled_at_random(seed))}
    assert failures == {}
