"""When a run writes its checkpoints: every step, in the background, or on exit.

Whatever the mode, each write is one atomic append (the step's messages plus its
checkpoint), so a crash never leaves half a step behind. The modes differ in what a
crash can lose: nothing that was acknowledged (``step``), the steps still queued
(``background``), or everything since the run last stopped (``exit``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

from statekeeper.core.messages import Message, utcnow
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunStore

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
    ) -> None:
        if mode not in ("step", "background", "exit"):
            raise ValueError(f"unknown write mode {mode!r}: use step, background or exit")
        self.runs = runs
        self.mode = mode
        self.revision = revision
        self.index_version = index_version
        self.owner = owner
        self.lease_ttl = lease_ttl
        self._held: list[Message] = []
        self._latest: RunState | None = None
        self._queue: asyncio.Queue[tuple[RunState, list[Message]] | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    async def save(self, state: RunState, messages: Sequence[Message] = ()) -> None:
        """Record a checkpoint of ``state`` after ``messages`` (written per the mode)."""
        if self._failure is not None:
            raise self._failure
        snapshot = state.model_copy(deep=True)
        if self.mode == "step":
            await self._write(snapshot, list(messages))
            state.revision, state.transcript_seq = snapshot.revision, snapshot.transcript_seq
        elif self.mode == "exit":
            self._held.extend(messages)
            self._latest = snapshot
        else:
            if self._queue is None:
                self._queue = asyncio.Queue()
                self._task = asyncio.create_task(self._drain())
            self._queue.put_nowait((snapshot, list(messages)))

    async def flush(self, state: RunState, *, release: bool = False) -> None:
        """Make everything saved so far durable (and release the run's lease if asked)."""
        if release:
            self.owner = None
        if self.mode == "exit":
            latest = self._latest or state.model_copy(deep=True)
            held, self._held, self._latest = self._held, [], None
            await self._write(latest, held)
        elif self.mode == "background" and self._queue is not None:
            self._queue.put_nowait(None)
            assert self._task is not None
            await self._task
            self._queue = self._task = None
            if self._failure is not None:
                raise self._failure
            if release:
                await self._write(state.model_copy(deep=True), [])
        elif release:
            await self._write(state.model_copy(deep=True), [])
        state.revision = self.revision

    async def _drain(self) -> None:
        assert self._queue is not None
        while (item := await self._queue.get()) is not None:
            if self._failure is None:
                try:
                    await self._write(*item)
                except Exception as exc:  # surfaced by the next save() or flush()
                    self._failure = exc

    async def _write(self, snapshot: RunState, messages: list[Message]) -> None:
        snapshot.revision = self.revision
        lease = utcnow() + timedelta(seconds=self.lease_ttl) if self.owner else None
        saved = await self.runs.save(
            snapshot,
            messages,
            index_version=self.index_version,
            owner=self.owner,
            lease_until=lease,
        )
        self.revision = snapshot.revision
        self.index_version = saved.index_version
