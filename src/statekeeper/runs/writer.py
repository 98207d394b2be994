"""When a run writes its checkpoints: every step, in the background, or on exit.

Whatever the mode, each write is one atomic append (the step's messages plus its
checkpoint), so a crash never leaves half a step behind. The modes differ in what a
crash can lose: nothing that was acknowledged (``step``), the steps still queued
(``background``), or everything since the run last stopped (``exit``).

In mode ``step`` the append also logs the run's events queued since its last write (the
status moves, what the agent said: `RunLifecycle.publish_with`) and those its tool calls
fanned out ahead (`EventBus.publish_ahead`), when the runner's event bus logs to the
same store: one transaction, one fsync, per step, with or without tools. The other
modes publish events on their own, as they happen.

The run's index record is written with its own compare-and-set after the append, only
when something others look at changed (the status, the lease running low, the run
stopping): loading finds the newest checkpoint past the index anyway, reading back from
the end of the session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

from statekeeper.core.messages import Message, utcnow
from statekeeper.runs.lifecycle import RunLifecycle
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunStore, Saved
from statekeeper.stores.base import Event, EventBatch

__all__ = ["CheckpointWriter", "WriteMode"]

WriteMode = Literal["step", "background", "exit"]


class CheckpointWriter:
    """Writes one run's checkpoints in order, in the chosen mode."""

    def __init__(
        self,
        runs: RunStore,
        mode: WriteMode,
        *,
        revision: int,
        index_version: int | None,
        owner: str | None,
        lease_ttl: float,
        lifecycle: RunLifecycle | None = None,
    ) -> None:
        if mode not in ("step", "background", "exit"):
            raise ValueError(f"unknown write mode {mode!r}: use step, background or exit")
        self.runs = runs
        self.mode = mode
        self.revision = revision
        self.index_version = index_version
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.lifecycle = lifecycle
        self._held: list[Message] = []
        self._latest: RunState | None = None
        self._queue: asyncio.Queue[tuple[RunState, list[Message]] | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self.written: set[int] = set()
        """Seqs of the entries this writer appended (to tell others' appends apart)."""
        self._indexed_status: str | None = None
        self._checkpoint_seq: int | None = None
        self._latest_written: RunState | None = None
        self._lease_due = utcnow()

    @property
    def joins_events(self) -> bool:
        """Whether a checkpoint write carries the run's queued events (mode ``step``,
        with an event bus logging to the runs' store)."""
        lifecycle = self.lifecycle
        return (
            self.mode == "step"
            and lifecycle is not None
            and lifecycle.joins(self.runs.store, self.runs.tenant)
        )

    async def save(self, state: RunState, messages: Sequence[Message] = ()) -> None:
        """Record a checkpoint of ``state`` after ``messages`` (written per the mode)."""
        if self._failure is not None:
            raise self._failure
        if self.mode == "step":
            await self._write(state, list(messages))  # written now: no copy needed
            return
        snapshot = state.copy_state()
        if self.mode == "exit":
            self._held.extend(messages)
            self._latest = snapshot
        else:
            if self._queue is None:
                self._queue = asyncio.Queue()
                self._task = asyncio.create_task(self._drain())
            self._queue.put_nowait((snapshot, list(messages)))

    async def flush(self, state: RunState, *, release: bool = False) -> None:
        """Make everything saved so far durable (and release the run's lease if asked)."""
        if self.mode == "exit" and (self._latest is not None or self._held):
            latest = self._latest or state.copy_state()
            held, self._held, self._latest = self._held, [], None
            await self._write(latest, held, final=True)
        elif self.mode == "background" and self._queue is not None:
            self._queue.put_nowait(None)
            assert self._task is not None
            await self._task
            self._queue = self._task = None
            if self._failure is not None:
                raise self._failure
        if release:
            written = (
                self._latest_written if self.mode != "step" and self._latest_written else state
            )
            await self.runs.release(written, owner=self.owner, checkpoint_seq=self._checkpoint_seq)
            self.owner = None
        state.revision = self.revision

    async def _drain(self) -> None:
        assert self._queue is not None
        while (item := await self._queue.get()) is not None:
            if self._failure is None:
                try:
                    await self._write(*item)
                except Exception as exc:  # surfaced by the next save() or flush()
                    self._failure = exc

    def _index_due(self, snapshot: RunState, final: bool) -> bool:
        # The index is a cache (loading reads back from the session's end to the newest
        # checkpoint, however stale the index is), so a running run writes it only when
        # something others look at changed: the status, or the lease running low.
        return final or snapshot.status != self._indexed_status or utcnow() >= self._lease_due

    async def _write(
        self, snapshot: RunState, messages: list[Message], *, final: bool = False
    ) -> None:
        snapshot.revision = self.revision
        update = self._index_due(snapshot, final)
        now = utcnow()
        lease = now + timedelta(seconds=self.lease_ttl) if self.owner else None
        if self.joins_events:
            saved = await self._save_with_events(snapshot, messages)
            if update:
                version = await self.runs.index_saved(
                    snapshot,
                    saved.checkpoint_seq,
                    self.index_version,
                    owner=self.owner,
                    lease_until=lease,
                )
                saved = saved.model_copy(update={"index_version": version})
        else:
            saved = await self.runs.save(
                snapshot,
                messages,
                index_version=self.index_version,
                owner=self.owner,
                lease_until=lease,
                update_index=update,
            )
        self.revision = snapshot.revision
        self.written.update(e.seq for e in saved.entries)
        self.written.add(saved.checkpoint_seq)
        self._checkpoint_seq = saved.checkpoint_seq
        self._latest_written = snapshot if self.mode != "step" else None
        if update:
            self.index_version = saved.index_version
            self._indexed_status = snapshot.status
            self._lease_due = now + timedelta(seconds=self.lease_ttl / 2)

    async def _save_with_events(self, snapshot: RunState, messages: list[Message]) -> Saved:
        """The checkpoint append, logging the run's queued events with it."""
        assert self.lifecycle is not None
        done: list[Saved] = []

        async def write(events: EventBatch | None) -> list[Event]:
            saved = await self.runs.save(
                snapshot,
                messages,
                index_version=self.index_version,
                update_index=False,
                events=events,
            )
            done.append(saved)
            return saved.events

        runs = self.runs
        await self.lifecycle.publish_with(snapshot, runs.store, runs.tenant, write)
        return done[-1]
