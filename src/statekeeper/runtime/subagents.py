"""The subagent registry: the delegated (child) runs a requester started, and their fate.

Each entry is one versioned record, namespace ``subagents``, key = the child's run id,
and every status change is a compare-and-set on it: when two processes settle the same
run, one wins and the other sees the new status (`SubagentFinishedError`, or a skip in
`SubagentRegistry.recover`).

Ownership: the process running a child is its ``owner`` (a worker id; use a fresh one per
process start, e.g. ``new_id("worker")``) and calls `SubagentRegistry.heartbeat`
regularly. At start-up `SubagentRegistry.recover` settles runs left ``running`` by owners
that are gone (a stale heartbeat, or named dead): resumed here when ``can_resume`` says
so, else failed with the outcome ``"orphaned: owner <id> stopped"``.

Statuses: running <-> paused (the child stopped, resumable: at a limit, waiting for input
or an approval, rate limited; ``outcome`` says why), running | paused -> completed |
failed | killed; the last three are final. A paused child is run by nobody: it needs no
heartbeat and is no orphan.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from statekeeper.core.messages import Message, utcnow
from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    InvalidTransitionError,
    NotFoundError,
)
from statekeeper.ids import validate_id
from statekeeper.retry import retry_on_conflict
from statekeeper.stores.base import RecordStore, VersionedRecord

__all__ = [
    "NAMESPACE",
    "Recovery",
    "SubagentEntry",
    "SubagentFinishedError",
    "SubagentRegistry",
    "SubagentStatus",
]

NAMESPACE: Final = "subagents"


class SubagentStatus(StrEnum):
    """Where a child run stands."""

    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    KILLED = "killed"


class SubagentFinishedError(InvalidTransitionError):
    """The child run is already completed, failed or killed: it cannot change any more."""

    def __init__(self, run_id: str, status: str, action: str):
        super().__init__(status, action, frozenset())
        self.args = (
            f"subagent run {run_id!r} is already {status}; cannot {action} it "
            "(a finished run is final: start a new one)",
        )
        self.run_id = run_id
        self.status = status


class SubagentEntry(BaseModel):
    """One delegated run. ``version`` is the stored record's (for compare-and-set)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    child_session_id: str
    requester_session_id: str
    task: str
    status: SubagentStatus = SubagentStatus.RUNNING
    outcome: str | None = None
    """A finished child's result summary (or why it failed); a paused one's reason."""
    model: str | None = None
    started_at: AwareDatetime
    completed_at: AwareDatetime | None = None
    delivery: dict[str, JsonValue] = Field(default_factory=dict)
    """Where the result goes (channel, sender ...), for announcing completion."""
    owner: str
    """The worker (process) id that runs the child."""
    heartbeat_at: AwareDatetime
    version: int = Field(default=0, exclude=True)

    @property
    def finished(self) -> bool:
        """True once completed, failed or killed."""
        return self.status not in (SubagentStatus.RUNNING, SubagentStatus.PAUSED)


@dataclass
class Recovery:
    """What `SubagentRegistry.recover` did."""

    resumed: list[SubagentEntry] = field(default_factory=list)
    """Orphans now owned (and resumed) by this registry."""
    failed: list[SubagentEntry] = field(default_factory=list)
    """Orphans marked failed."""
    skipped: list[str] = field(default_factory=list)
    """Run ids another process settled (or whose owner came back) first."""


def _entry(record: VersionedRecord) -> SubagentEntry:
    value: Any = record.value
    return SubagentEntry.model_validate({**value, "version": record.version})


class SubagentRegistry:
    """The subagent runs of one tenant, as seen by one worker (``owner_id``).

    Args:
        store: any `RecordStore` (a whole `Store` is one): only its records are used.
        kill: cancels a child run (given its run id); without it `kill` only records.
        steer: injects a message into a running child run.
        clock: the time source (inject one in tests).
    """

    def __init__(
        self,
        store: RecordStore,
        tenant: str,
        *,
        owner_id: str,
        kill: Callable[[str], Awaitable[None]] | None = None,
        steer: Callable[[str, Message], Awaitable[None]] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._store, self._clock = store, clock
        self.tenant = validate_id(tenant, "tenant")
        self.owner_id = validate_id(owner_id, "owner id")
        self._kill, self._steer = kill, steer

    # -- storage --------------------------------------------------------------------------

    async def _put(self, entry: SubagentEntry, expected_version: int) -> SubagentEntry:
        record = await self._store.put_record(
            self.tenant,
            NAMESPACE,
            entry.run_id,
            entry.model_dump(mode="json"),
            expected_version=expected_version,
        )
        return entry.model_copy(update={"version": record.version})

    async def get(self, run_id: str) -> SubagentEntry:
        """The entry of a run, or `NotFoundError`."""
        try:
            record = await self._store.get_record(self.tenant, NAMESPACE, run_id)
        except NotFoundError:
            raise NotFoundError(f"no subagent run {run_id!r}") from None
        return _entry(record)

    async def list(
        self, requester: str | None = None, status: SubagentStatus | str | None = None
    ) -> builtins.list[SubagentEntry]:
        """Entries (of one requester session, in one status), oldest start first."""
        found: builtins.list[SubagentEntry] = []
        after: str | None = None
        while page := await self._store.list_records(
            self.tenant, NAMESPACE, after_key=after, limit=500
        ):
            after = page[-1].key
            for record in page:
                entry = _entry(record)
                if (requester is None or entry.requester_session_id == requester) and (
                    status is None or entry.status == status
                ):
                    found.append(entry)
        return sorted(found, key=lambda e: (e.started_at, e.run_id))

    # -- lifecycle ------------------------------------------------------------------------

    async def register(
        self,
        run_id: str,
        *,
        child_session_id: str,
        requester_session_id: str,
        task: str,
        model: str | None = None,
        delivery: dict[str, JsonValue] | None = None,
    ) -> SubagentEntry:
        """Record a child run this worker starts. `AlreadyExistsError` if the id is taken."""
        validate_id(run_id, "run id")
        now = self._clock()
        entry = SubagentEntry(
            run_id=run_id,
            child_session_id=validate_id(child_session_id, "child session id"),
            requester_session_id=validate_id(requester_session_id, "requester session id"),
            task=task,
            model=model,
            started_at=now,
            delivery=delivery or {},
            owner=self.owner_id,
            heartbeat_at=now,
        )
        try:
            return await self._put(entry, 0)
        except ConflictError:
            raise AlreadyExistsError(f"subagent run {run_id!r} is already registered") from None

    async def _settle(
        self, run_id: str, status: SubagentStatus, outcome: str | None, action: str
    ) -> SubagentEntry:
        """Move a running entry to a final status (compare-and-set, re-read on conflict)."""

        async def attempt() -> SubagentEntry:
            entry = await self.get(run_id)
            if entry.finished:
                raise SubagentFinishedError(run_id, entry.status, action)
            done = entry.model_copy(
                update={"status": status, "outcome": outcome, "completed_at": self._clock()}
            )
            return await self._put(done, entry.version)

        return await retry_on_conflict(attempt, attempts=20)

    async def complete(self, run_id: str, outcome: str | None = None) -> SubagentEntry:
        """The child finished its task; ``outcome`` is its result summary."""
        return await self._settle(run_id, SubagentStatus.COMPLETED, outcome, "complete")

    async def fail(self, run_id: str, reason: str) -> SubagentEntry:
        """The child failed; ``reason`` becomes its outcome."""
        return await self._settle(run_id, SubagentStatus.FAILED, reason, "fail")

    async def pause(self, run_id: str, reason: str) -> SubagentEntry:
        """The child stopped, resumable (``reason``: at a limit, waiting for input ...).

        `NotFoundError` for an unknown run, `SubagentFinishedError` for a finished one.
        """

        async def attempt() -> SubagentEntry:
            entry = await self.get(run_id)
            if entry.finished:
                raise SubagentFinishedError(run_id, entry.status, "pause")
            if entry.status is SubagentStatus.PAUSED and entry.outcome == reason:
                return entry
            paused = entry.model_copy(update={"status": SubagentStatus.PAUSED, "outcome": reason})
            return await self._put(paused, entry.version)

        return await retry_on_conflict(attempt, attempts=20)

    async def resume(self, run_id: str) -> SubagentEntry:
        """A paused child runs again, owned by this worker (heartbeat now).

        `NotFoundError` for an unknown run, `SubagentFinishedError` for a finished one.
        """

        async def attempt() -> SubagentEntry:
            entry = await self.get(run_id)
            if entry.finished:
                raise SubagentFinishedError(run_id, entry.status, "resume")
            if entry.status is SubagentStatus.RUNNING and entry.owner == self.owner_id:
                return entry
            running = entry.model_copy(
                update={
                    "status": SubagentStatus.RUNNING,
                    "outcome": None,
                    "owner": self.owner_id,
                    "heartbeat_at": self._clock(),
                }
            )
            return await self._put(running, entry.version)

        return await retry_on_conflict(attempt, attempts=20)

    async def kill(self, run_id: str) -> SubagentEntry:
        """Cancel a running child (through the kill callback) and mark it killed.

        `NotFoundError` for an unknown run, `SubagentFinishedError` for a finished one. If
        the child finishes while being killed, its own outcome stands and is returned.
        """
        entry = await self.get(run_id)
        if entry.finished:
            raise SubagentFinishedError(run_id, entry.status, "kill")
        if self._kill is not None:
            await self._kill(run_id)
        try:
            return await self._settle(run_id, SubagentStatus.KILLED, "killed", "kill")
        except SubagentFinishedError:
            return await self.get(run_id)

    async def steer(self, run_id: str, message: Message | str) -> None:
        """Send a message into a running child (through the steer callback).

        `NotFoundError` for an unknown run, `SubagentFinishedError` for a finished one.
        """
        if self._steer is None:
            raise InvalidInputError("this registry has no steer callback; pass steer=...")
        entry = await self.get(run_id)
        if entry.finished:
            raise SubagentFinishedError(run_id, entry.status, "steer")
        if isinstance(message, str):
            message = Message(role="user", content=message)
        await self._steer(run_id, message)

    async def forget(self, run_id: str) -> None:
        """Delete a finished entry (retention). Running entries cannot be forgotten."""
        entry = await self.get(run_id)
        if not entry.finished:
            raise InvalidInputError(
                f"subagent run {run_id!r} is still {entry.status}; kill it first"
            )
        await self._store.delete_record(
            self.tenant, NAMESPACE, run_id, expected_version=entry.version
        )

    # -- ownership ------------------------------------------------------------------------

    async def heartbeat(self) -> int:
        """Mark this worker's running children alive now; returns how many were updated."""
        count = 0
        for entry in await self.list(status=SubagentStatus.RUNNING):
            if entry.owner != self.owner_id:
                continue
            beat = entry.model_copy(update={"heartbeat_at": self._clock()})
            try:
                await self._put(beat, entry.version)
                count += 1
            except ConflictError:
                pass  # settled (or taken over) meanwhile: no longer ours to keep alive
        return count

    async def recover(
        self,
        *,
        can_resume: Callable[[SubagentEntry], Awaitable[bool]] | None = None,
        resume: Callable[[SubagentEntry], Awaitable[None]] | None = None,
        dead_owners: Collection[str] = (),
        stale_after: timedelta = timedelta(minutes=5),
    ) -> Recovery:
        """Settle runs left ``running`` by owners that are gone.

        An orphan is a running entry whose owner is in ``dead_owners``, or is another
        worker whose heartbeat is older than ``stale_after``. When ``can_resume(entry)``
        is true, this registry takes it over (owner and heartbeat, compare-and-set) and
        then calls ``resume(entry)``; otherwise it is marked failed with the outcome
        ``"orphaned: owner <id> stopped"``. An orphan another process settles first is
        skipped. A ``resume`` that raises marks the run failed.
        """
        report = Recovery()
        now = self._clock()
        for entry in await self.list(status=SubagentStatus.RUNNING):
            dead = entry.owner in dead_owners
            stale = entry.owner != self.owner_id and entry.heartbeat_at < now - stale_after
            if not (dead or stale):
                continue
            take_over = can_resume is not None and await can_resume(entry)
            if take_over:
                changed = entry.model_copy(update={"owner": self.owner_id, "heartbeat_at": now})
            else:
                changed = entry.model_copy(
                    update={
                        "status": SubagentStatus.FAILED,
                        "outcome": f"orphaned: owner {entry.owner} stopped",
                        "completed_at": now,
                    }
                )
            try:
                settled = await self._put(changed, entry.version)
            except ConflictError:
                report.skipped.append(entry.run_id)
                continue
            if not take_over:
                report.failed.append(settled)
                continue
            try:
                if resume is not None:
                    await resume(settled)
            except Exception as exc:
                report.failed.append(await self.fail(entry.run_id, f"resume failed: {exc}"))
            else:
                report.resumed.append(settled)
        return report
