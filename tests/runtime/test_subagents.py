"""The subagent registry: register, list, kill, steer, heartbeats and orphan recovery
(with a compare-and-set race), on the memory and SQLite stores, with an injected clock."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from fakes import START, Clock

from statekeeper.core.messages import Message
from statekeeper.errors import (
    AlreadyExistsError,
    InvalidInputError,
    InvalidTransitionError,
    NotFoundError,
)
from statekeeper.runtime.subagents import (
    SubagentEntry,
    SubagentFinishedError,
    SubagentRegistry,
    SubagentStatus,
)
from statekeeper.stores.base import RecordStore

TENANT = "alice"


class Controls:
    """Kill and steer callbacks that record their calls."""

    def __init__(self) -> None:
        self.killed: list[str] = []
        self.steered: list[tuple[str, Message]] = []

    async def kill(self, run_id: str) -> None:
        self.killed.append(run_id)

    async def steer(self, run_id: str, message: Message) -> None:
        self.steered.append((run_id, message))


@pytest.fixture
def controls() -> Controls:
    return Controls()


@pytest.fixture
def registry(record_store: RecordStore, clock: Clock, controls: Controls) -> SubagentRegistry:
    return SubagentRegistry(
        record_store,
        TENANT,
        owner_id="worker-a",
        kill=controls.kill,
        steer=controls.steer,
        clock=clock,
    )


async def spawn(registry: SubagentRegistry, run_id: str, requester: str = "s-parent") -> None:
    await registry.register(
        run_id,
        child_session_id=f"child-{run_id}",
        requester_session_id=requester,
        task=f"research {run_id}",
        model="small-model",
        delivery={"channel": "slack", "sender": "u1"},
    )


async def test_register_and_get(registry: SubagentRegistry) -> None:
    await spawn(registry, "r1")
    entry = await registry.get("r1")
    assert (entry.status, entry.owner, entry.started_at, entry.heartbeat_at) == (
        SubagentStatus.RUNNING,
        "worker-a",
        START,
        START,
    )
    assert (entry.child_session_id, entry.task, entry.model) == (
        "child-r1",
        "research r1",
        "small-model",
    )
    assert entry.delivery == {"channel": "slack", "sender": "u1"}
    assert not entry.finished
    with pytest.raises(AlreadyExistsError):
        await spawn(registry, "r1")
    with pytest.raises(NotFoundError):
        await registry.get("nope")
    with pytest.raises(InvalidInputError):
        await spawn(registry, "../bad")


async def test_list_by_requester_and_status(registry: SubagentRegistry, clock: Clock) -> None:
    for run_id, requester in (("r1", "s1"), ("r2", "s2"), ("r3", "s1")):
        await spawn(registry, run_id, requester)
        clock.advance(1)
    await registry.complete("r3", "found it")
    assert [e.run_id for e in await registry.list()] == ["r1", "r2", "r3"]
    assert [e.run_id for e in await registry.list(requester="s1")] == ["r1", "r3"]
    assert [e.run_id for e in await registry.list(status="running")] == ["r1", "r2"]
    done = await registry.list(requester="s1", status=SubagentStatus.COMPLETED)
    assert [(e.run_id, e.outcome, e.completed_at) for e in done] == [
        ("r3", "found it", START + timedelta(seconds=3))
    ]
    assert await registry.list(requester="s3") == []


async def test_complete_and_fail_are_final(registry: SubagentRegistry) -> None:
    await spawn(registry, "r1")
    await spawn(registry, "r2")
    assert (await registry.complete("r1", "ok")).status == SubagentStatus.COMPLETED
    failed = await registry.fail("r2", "tool crashed")
    assert (failed.status, failed.outcome) == (SubagentStatus.FAILED, "tool crashed")
    with pytest.raises(SubagentFinishedError, match="already completed"):
        await registry.fail("r1", "late")
    with pytest.raises(InvalidTransitionError):
        await registry.complete("r2")
    with pytest.raises(NotFoundError):
        await registry.complete("nope")


async def test_kill_calls_the_callback_and_marks_killed(
    registry: SubagentRegistry, controls: Controls
) -> None:
    await spawn(registry, "r1")
    killed = await registry.kill("r1")
    assert controls.killed == ["r1"]
    assert (killed.status, killed.outcome) == (SubagentStatus.KILLED, "killed")
    assert (await registry.get("r1")).status == SubagentStatus.KILLED
    with pytest.raises(SubagentFinishedError) as caught:
        await registry.kill("r1")
    assert (caught.value.run_id, caught.value.status) == ("r1", "killed")
    with pytest.raises(NotFoundError):
        await registry.kill("unknown")
    assert controls.killed == ["r1"]


async def test_a_run_that_completes_while_being_killed_keeps_its_outcome(
    record_store: RecordStore, clock: Clock
) -> None:
    async def kill_but_it_finishes_first(run_id: str) -> None:
        await registry.complete(run_id, "finished anyway")

    registry = SubagentRegistry(
        record_store, TENANT, owner_id="w", kill=kill_but_it_finishes_first, clock=clock
    )
    await spawn(registry, "r1")
    entry = await registry.kill("r1")
    assert (entry.status, entry.outcome) == (SubagentStatus.COMPLETED, "finished anyway")


async def test_steer_calls_the_callback(registry: SubagentRegistry, controls: Controls) -> None:
    await spawn(registry, "r1")
    await registry.steer("r1", "focus on 2024")
    note = Message(role="user", content="also check 2023")
    await registry.steer("r1", note)
    assert [(r, m.content) for r, m in controls.steered] == [
        ("r1", "focus on 2024"),
        ("r1", "also check 2023"),
    ]
    await registry.complete("r1")
    with pytest.raises(SubagentFinishedError, match="steer"):
        await registry.steer("r1", "too late")
    with pytest.raises(NotFoundError):
        await registry.steer("unknown", "hello")
    assert len(controls.steered) == 2


async def test_without_callbacks(record_store: RecordStore) -> None:
    bare = SubagentRegistry(record_store, TENANT, owner_id="w")
    await spawn(bare, "r1")
    with pytest.raises(InvalidInputError, match="steer"):
        await bare.steer("r1", "hi")
    assert (await bare.kill("r1")).status == SubagentStatus.KILLED


async def test_forget_a_finished_entry(registry: SubagentRegistry) -> None:
    await spawn(registry, "r1")
    with pytest.raises(InvalidInputError):
        await registry.forget("r1")
    await registry.complete("r1")
    await registry.forget("r1")
    with pytest.raises(NotFoundError):
        await registry.get("r1")


async def test_heartbeat_touches_only_this_owners_running_runs(
    record_store: RecordStore, registry: SubagentRegistry, clock: Clock
) -> None:
    other = SubagentRegistry(record_store, TENANT, owner_id="worker-b", clock=clock)
    await spawn(registry, "mine")
    await spawn(registry, "mine-done")
    await registry.complete("mine-done")
    await spawn(other, "theirs")
    clock.advance(30)
    assert await registry.heartbeat() == 1
    assert (await registry.get("mine")).heartbeat_at == START + timedelta(seconds=30)
    assert (await registry.get("theirs")).heartbeat_at == START


async def test_recover_fails_orphans_of_stale_or_dead_owners(
    record_store: RecordStore, clock: Clock
) -> None:
    gone = SubagentRegistry(record_store, TENANT, owner_id="worker-old", clock=clock)
    alive = SubagentRegistry(record_store, TENANT, owner_id="worker-alive", clock=clock)
    named_dead = SubagentRegistry(record_store, TENANT, owner_id="worker-dead", clock=clock)
    await spawn(gone, "stale")
    await spawn(gone, "finished")
    await gone.complete("finished", "done")
    await spawn(alive, "healthy")
    await spawn(named_dead, "fresh-but-dead")
    clock.advance(600)
    await alive.heartbeat()
    await named_dead.heartbeat()

    new = SubagentRegistry(record_store, TENANT, owner_id="worker-new", clock=clock)
    report = await new.recover(dead_owners={"worker-dead"}, stale_after=timedelta(minutes=5))
    assert sorted(e.run_id for e in report.failed) == ["fresh-but-dead", "stale"]
    assert report.resumed == []
    assert report.skipped == []
    stale = await new.get("stale")
    assert (stale.status, stale.outcome, stale.completed_at) == (
        SubagentStatus.FAILED,
        "orphaned: owner worker-old stopped",
        clock.now,
    )
    assert (await new.get("healthy")).status == SubagentStatus.RUNNING
    assert (await new.get("finished")).outcome == "done"
    assert (await new.recover()).failed == []  # nothing left to settle


async def test_recover_resumes_what_can_resume(record_store: RecordStore, clock: Clock) -> None:
    gone = SubagentRegistry(record_store, TENANT, owner_id="worker-old", clock=clock)
    for run_id in ("keep", "drop", "broken"):
        await spawn(gone, run_id)
    clock.advance(3600)
    resumed: list[str] = []

    async def can_resume(entry: SubagentEntry) -> bool:
        return entry.run_id != "drop"

    async def resume(entry: SubagentEntry) -> None:
        if entry.run_id == "broken":
            raise RuntimeError("checkpoint missing")
        resumed.append(entry.run_id)

    new = SubagentRegistry(record_store, TENANT, owner_id="worker-new", clock=clock)
    report = await new.recover(can_resume=can_resume, resume=resume)
    assert [e.run_id for e in report.resumed] == ["keep"]
    assert resumed == ["keep"]
    keep = await new.get("keep")
    assert (keep.status, keep.owner, keep.heartbeat_at) == ("running", "worker-new", clock.now)
    assert (await new.get("drop")).outcome == "orphaned: owner worker-old stopped"
    broken = await new.get("broken")
    assert (broken.status, broken.outcome) == ("failed", "resume failed: checkpoint missing")
    assert sorted(e.run_id for e in report.failed) == ["broken", "drop"]


async def test_two_registries_settling_one_orphan_one_wins(
    record_store: RecordStore, clock: Clock
) -> None:
    gone = SubagentRegistry(record_store, TENANT, owner_id="worker-old", clock=clock)
    await spawn(gone, "orphan")
    clock.advance(3600)
    both_checked = asyncio.Event()
    checked = 0

    async def can_resume(entry: SubagentEntry) -> bool:
        nonlocal checked
        checked += 1
        if checked == 2:
            both_checked.set()
        await both_checked.wait()  # both read the same version before either writes
        return True

    started: list[str] = []

    def resumer(owner: str) -> Any:
        async def resume(entry: SubagentEntry) -> None:
            started.append(owner)

        return resume

    one = SubagentRegistry(record_store, TENANT, owner_id="worker-1", clock=clock)
    two = SubagentRegistry(record_store, TENANT, owner_id="worker-2", clock=clock)
    reports = await asyncio.gather(
        one.recover(can_resume=can_resume, resume=resumer("worker-1")),
        two.recover(can_resume=can_resume, resume=resumer("worker-2")),
    )
    assert sorted(len(r.resumed) for r in reports) == [0, 1]
    assert sorted(r.skipped for r in reports) == [[], ["orphan"]]
    winner = await one.get("orphan")
    assert started == [winner.owner]  # only the winner resumed the run
    assert winner.status == SubagentStatus.RUNNING


async def test_two_registries_failing_one_orphan_one_wins(
    record_store: RecordStore, clock: Clock
) -> None:
    gone = SubagentRegistry(record_store, TENANT, owner_id="worker-old", clock=clock)
    await spawn(gone, "orphan")
    clock.advance(3600)
    gate = asyncio.Event()
    waiting = 0

    async def cannot_resume(entry: SubagentEntry) -> bool:
        nonlocal waiting
        waiting += 1
        if waiting == 2:
            gate.set()
        await gate.wait()
        return False

    regs = [SubagentRegistry(record_store, TENANT, owner_id=f"w{n}", clock=clock) for n in (1, 2)]
    reports = await asyncio.gather(*(r.recover(can_resume=cannot_resume) for r in regs))
    assert sorted(len(r.failed) for r in reports) == [0, 1]
    assert sum(len(r.skipped) for r in reports) == 1
    assert (await regs[0].get("orphan")).status == SubagentStatus.FAILED


async def test_a_paused_child_is_paused_until_it_runs_again(
    registry: SubagentRegistry, record_store: RecordStore, clock: Clock
) -> None:
    await spawn(registry, "r1")
    paused = await registry.pause("r1", "budget limit reached: 0.5 of 0.5")
    assert (paused.status, paused.outcome) == (
        SubagentStatus.PAUSED,
        "budget limit reached: 0.5 of 0.5",
    )
    assert not paused.finished
    assert [e.run_id for e in await registry.list(status="paused")] == ["r1"]
    with pytest.raises(InvalidInputError, match="still paused"):
        await registry.forget("r1")

    # Paused is run by nobody: no heartbeat kept, and not an orphan however old.
    assert await registry.heartbeat() == 0
    clock.advance(3600)
    other = SubagentRegistry(record_store, TENANT, owner_id="worker-b", clock=clock)
    report = await other.recover(dead_owners={"worker-a"})
    assert report.failed == []
    assert (await registry.get("r1")).status == SubagentStatus.PAUSED

    running = await other.resume("r1")  # resumed by another worker: it owns it now
    assert (running.status, running.outcome, running.owner) == (
        SubagentStatus.RUNNING,
        None,
        "worker-b",
    )
    assert running.heartbeat_at == clock()
    assert (await other.complete("r1", "done")).status == SubagentStatus.COMPLETED
    with pytest.raises(SubagentFinishedError, match="cannot pause"):
        await registry.pause("r1", "late")
    with pytest.raises(SubagentFinishedError, match="cannot resume"):
        await registry.resume("r1")
    with pytest.raises(NotFoundError):
        await registry.pause("nope", "why")


async def test_a_paused_child_can_be_killed(registry: SubagentRegistry, controls: Controls) -> None:
    await spawn(registry, "r1")
    await registry.pause("r1", "waiting for input")
    killed = await registry.kill("r1")
    assert (killed.status, controls.killed) == (SubagentStatus.KILLED, ["r1"])
