"""The event bus: typed, per-run ordered events with replay, for UIs, polling and waits.

The module split: what an event is and which are valid (`statekeeper.runtime.event_types`,
pure), how one subscriber buffers and catches up (`statekeeper.runtime.subscriptions`),
and here the bus, which publishes, logs, fans out and answers waits. The names of the
other two are re-exported here.

**Seqs** are per run, from 1, without gaps or repeats: from the store's event log (log id
= run id, shared by every process on the store), or with ``persist=False`` from an
in-memory log per run. A non-JSON payload raises `InvalidPayloadError` before anything is
stored and uses no seq. Publishes to a run that arrive while a write to it is under way
are written together, as one batch. `EventBus.publish_with` logs a run's events in
another write of the store instead (the runner's checkpoint append: one transaction
for a step's entries and its events) and fans them out once it lands.
`EventBus.publish_ahead` fans an event out at once and logs it with the run's next
write (`statekeeper.runtime.ahead`).

**Other processes'** events reach a run subscriber here when it sees a gap in the seqs
(this process published after them), on `Subscription.poll` / `EventBus.refresh`, with
``wait_for(poll_interval=...)``, or live with `statekeeper.runtime.coordination.feed_bus`
and a backend's event feed; replay always sees them. All-runs subscribers get this
process's events only.
"""

# ruff: noqa: ASYNC109 (wait_for's timeout is the documented API)
from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from statekeeper.core.messages import utcnow
from statekeeper.errors import ConflictError, InvalidInputError, NotFoundError, StatekeeperError
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import encode_json, loads
from statekeeper.runtime.ahead import AheadLog, drafts_of, write_ahead
from statekeeper.runtime.event_types import (
    STREAM_KINDS,
    BusEvent,
    RunSnapshot,
    SubscriberLaggedError,
    UnknownEventKindError,
    WaitTimeoutError,
    check_event,
)
from statekeeper.runtime.subscriptions import Subscription, poll_every
from statekeeper.stores.base import Event, EventBatch, EventDraft, EventLogStore

__all__ = [
    "STREAM_KINDS",
    "BusEvent",
    "EventBus",
    "RunSnapshot",
    "SubscriberLaggedError",
    "Subscription",
    "UnknownEventKindError",
    "WaitTimeoutError",
    "check_event",
]

_PAGE = 256

_Pending = list[tuple[EventDraft, asyncio.Future[BusEvent]]]
_REFUSED = (InvalidInputError, ConflictError, NotFoundError)
"""Errors of a write that wrote nothing (the store checks before it writes)."""


def _from_store(event: Event) -> BusEvent:
    return BusEvent(event.log_id, event.seq, event.stream, event.kind, event.ts, event.payload)


class EventBus:
    """Publish and subscribe to the events of runs, for one tenant.

    Args:
        store: where events are logged (log id = run id) when ``persist`` is true:
            any `EventLogStore` (a whole `Store` is one).
        persist: False keeps each run's log in this process's memory only (until
            `delete_run`), for tests and ephemeral runs.
        buffer: the default number of events a subscriber may hold before it lags.
        max_cached_runs: run snapshots kept in memory (least recently updated dropped).
        clock: the timestamp source (timezone-aware).
    """

    def __init__(
        self,
        store: EventLogStore | None,
        tenant: str,
        *,
        persist: bool = True,
        buffer: int = 1024,
        max_cached_runs: int = 4096,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if (persist and store is None) or buffer < 1:
            raise InvalidInputError("EventBus needs a store (or persist=False) and buffer >= 1")
        self._store, self.tenant = store, validate_id(tenant, "tenant")
        self.persist, self.buffer, self._clock = persist, buffer, clock
        self._max_runs = max_cached_runs
        self._memlog: dict[str, list[BusEvent]] = {}
        self._pending: dict[str, _Pending] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._by_run: dict[str, set[Subscription]] = {}
        self._all: set[Subscription] = set()
        self._snapshots: OrderedDict[str, RunSnapshot] = OrderedDict()
        self._ahead = AheadLog(max_cached_runs)

    @property
    def store(self) -> EventLogStore | None:
        """Where the bus logs events (None: nowhere, with ``persist=False``)."""
        return self._store if self.persist else None

    # -- publishing -----------------------------------------------------------------------

    async def publish(
        self, run_id: str, stream: str, kind: str, payload: Mapping[str, Any] | None = None
    ) -> BusEvent:
        """Log an event with the run's next seq, fan it out and return it.

        Raises `UnknownEventKindError` or `InvalidPayloadError` (nothing stored, no seq
        used). A publish cancelled while writing may still log its event (the store
        finishes a write it started); the run's subscribers then read it from the log.
        """
        if type(run_id) is not str or run_id not in self._snapshots:  # cached: validated
            validate_id(run_id, "run id")
        payload = {} if payload is None else payload
        check_event(stream, kind, payload)
        ts, pending = self._clock(), self._pending.get(run_id)
        if not self.persist or pending is not None:
            # Validated, and a private copy: the caller may change its dict afterwards.
            copy = loads(encode_json(payload, what=f"event {stream}/{kind} payload"))
            if not self.persist:
                log = self._memlog.setdefault(run_id, [])
                event = BusEvent(run_id, len(log) + 1, stream, kind, ts, copy)
                log.append(event)
                self._fan_out(event)
                return event
        if pending is not None:
            # A write to this run is under way: join the next batch, written by a task
            # (so it is published even if this caller is cancelled).
            future: asyncio.Future[BusEvent] = asyncio.get_running_loop().create_future()
            pending.append(
                (EventDraft.model_construct(stream=stream, kind=kind, payload=copy, ts=ts), future)
            )
            return await future
        # Written now: the store validates and encodes the payload before it writes.
        draft = EventDraft.model_construct(stream=stream, kind=kind, payload=dict(payload), ts=ts)
        assert self._store is not None
        self._pending[run_id] = []
        try:
            ahead = self._ahead.take(run_id)
            if ahead:  # they go first: a batch of their drafts and this one
                stored = await self._write_ahead(run_id, ahead, [draft])
            else:
                [stored] = await self._store.append_events(self.tenant, run_id, [draft])
            self._fan_out(event := _from_store(stored))
            return event
        except asyncio.CancelledError:
            self.refresh(run_id)  # it may be logged anyway: the run's subscribers re-read
            raise
        finally:
            self._written(run_id)

    async def publish_with(
        self,
        run_id: str,
        events: Sequence[tuple[str, str, Mapping[str, Any]]],
        write: Callable[[EventBatch | None], Awaitable[Sequence[Event]]],
    ) -> list[BusEvent]:
        """Publish the run's ``events`` (stream, kind, payload) in a write that logs them
        with something else: ``write`` gets the batch for ``append_entries(events=...)``
        and returns the events it logged (`AppendResult.events`); they are fanned out
        in seq order once it lands, so they are logged with what it writes or not at all.

        When the bus cannot join them to the write (it does not persist, or a write to
        the run is under way, whose events must come first), it publishes them as
        `publish` does and then calls ``write(None)``. A write refused before it wrote
        (`InvalidInputError`, `ConflictError`, `NotFoundError`) re-raises after the
        events are published on their own, as if they had been published before it.
        """
        if type(run_id) is not str or run_id not in self._snapshots:
            validate_id(run_id, "run id")
        for stream, kind, payload in events:
            check_event(stream, kind, payload)
        if not self.persist or run_id in self._pending or not (events or self._ahead.has(run_id)):
            published = [await self.publish(run_id, *event) for event in events]
            await write(None)
            return published
        ts = self._clock()
        drafts = [
            EventDraft.model_construct(stream=stream, kind=kind, payload=dict(payload), ts=ts)
            for stream, kind, payload in events
        ]
        self._pending[run_id] = []  # publishes meanwhile queue behind the write
        ahead = self._ahead.take(run_id)
        try:
            try:
                batch = EventBatch(run_id, [*drafts_of(ahead), *drafts])
                stored = await write(batch)
            except _REFUSED:
                # Nothing written: the events go on their own (an error of theirs first).
                if ahead:
                    await self._write_ahead(run_id, ahead, [])
                loop = asyncio.get_running_loop()
                alone: _Pending = [(d, loop.create_future()) for d in drafts]
                await self._write_batch(run_id, alone)
                for _, future in alone:
                    future.result()
                raise
            except BaseException:
                self._settle(run_id, ahead, None)
                raise
            self._settle(run_id, ahead, stored[: len(ahead)])
            logged = [_from_store(e) for e in stored[len(ahead) :]]
            for event in logged:
                self._fan_out(event)
            return logged
        except asyncio.CancelledError:
            self.refresh(run_id)  # the write may land anyway: the run's subscribers re-read
            raise
        finally:
            self._written(run_id)

    async def publish_ahead(
        self, run_id: str, stream: str, kind: str, payload: Mapping[str, Any] | None = None
    ) -> BusEvent:
        """Fan an event out now, with the seq it will have, and log it with the run's
        next write through this bus (`publish`, `publish_with`, `flush_ahead`): for an
        event watchers here need at once that needs no write of its own (a tool call
        starting). Written at once, as `publish` does, when the bus does not know the
        run's last seq yet or a write to the run is under way (`statekeeper.runtime.ahead`).
        """
        if type(run_id) is not str or run_id not in self._snapshots:
            validate_id(run_id, "run id")
        payload = {} if payload is None else payload
        check_event(stream, kind, payload)
        seq = self._ahead.next_seq(run_id)
        if not self.persist or seq is None or run_id in self._pending:
            return await self.publish(run_id, stream, kind, payload)
        copy = loads(encode_json(payload, what=f"event {stream}/{kind} payload"))
        event = BusEvent(run_id, seq, stream, kind, self._clock(), copy)
        self._ahead.add(event)
        self._fan_out(event, logged=False)
        return event

    async def flush_ahead(self, run_id: str | None = None) -> None:
        """Log the events published ahead (of the run, or of every run) now."""
        for run in [run_id] if run_id is not None else self._ahead.runs():
            if self._ahead.has(run) and run not in self._pending:
                self._pending[run] = []
                try:
                    await self._write_ahead(run, self._ahead.take(run), [])
                finally:
                    self._written(run)

    async def _write_ahead(
        self, run_id: str, ahead: list[BusEvent], drafts: list[EventDraft]
    ) -> Event:
        assert self._store is not None
        settle = functools.partial(self._settle, run_id, ahead)
        return await write_ahead(self._store, self.tenant, ahead, drafts, settle, _REFUSED)

    def _settle(self, run_id: str, ahead: list[BusEvent], logged: Sequence[Event] | None) -> None:
        """After a write that carried ``ahead``: if it did not log them as announced,
        the run's subscribers go back to the first and read the log from there."""
        if not self._ahead.settle(ahead, logged):
            for sub in (*self._by_run.get(run_id, ()), *self._all):
                sub._void(run_id, ahead[0].seq)
            self._snapshots.pop(run_id, None)

    def _written(self, run_id: str) -> None:
        """A write to the run is done: publishes that arrived meanwhile go as one batch."""
        if self._pending[run_id]:
            task = asyncio.create_task(self._drain(run_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            del self._pending[run_id]

    def refresh(self, run_id: str | None = None) -> None:
        """Make the run's subscribers (None: every run's) read what other processes
        logged, and drop the cached snapshots concerned."""
        if run_id is None:
            for subs in self._by_run.values():
                for sub in subs:
                    sub.poll()
            self._snapshots.clear()
            return
        for sub in self._by_run.get(validate_id(run_id, "run id"), ()):
            sub.poll()
        self._snapshots.pop(run_id, None)

    async def _drain(self, run_id: str) -> None:
        """Write the run's pending events in batches; fan each batch out in seq order."""
        while batch := self._pending[run_id]:
            self._pending[run_id] = []
            try:
                await self._write_batch(run_id, batch)
            except BaseException as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
        del self._pending[run_id]

    async def _write_batch(self, run_id: str, batch: _Pending) -> None:
        assert self._store is not None
        drafts = [d for d, _ in batch]
        results: list[BusEvent | InvalidInputError] = []
        if len(drafts) > 1:
            with contextlib.suppress(InvalidInputError):  # then one by one: one bad draft
                written = await self._store.append_events(self.tenant, run_id, drafts)
                results = [_from_store(e) for e in written]
        for draft in drafts if not results else ():
            try:
                [one] = await self._store.append_events(self.tenant, run_id, [draft])
                results.append(_from_store(one))
            except InvalidInputError as exc:  # e.g. over the store's size limit
                results.append(exc)
        for (_, future), result in zip(batch, results, strict=True):
            if isinstance(result, BusEvent):
                self._fan_out(result)
            if future.done():  # the caller was cancelled
                continue
            if isinstance(result, InvalidInputError):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _fan_out(self, event: BusEvent, *, logged: bool = True) -> None:
        if logged:
            self._ahead.logged(event.run_id, event.seq)
        self._note(event)
        for sub in tuple(self._by_run.get(event.run_id, ())):
            sub._push(event)
        for sub in tuple(self._all):
            if sub._wants(event):
                sub._push(event)

    def _note(self, event: BusEvent) -> None:
        """Keep the run's snapshot current, from a complete, gap-free history only."""
        snap = self._snapshots.get(event.run_id)
        if snap is None and event.seq == 1:
            snap = self._cache(RunSnapshot(event.run_id))
        if snap is None or event.seq <= snap.last_seq:
            return
        if event.seq == snap.last_seq + 1:
            snap.apply(event)
            self._snapshots.move_to_end(event.run_id)
        else:
            del self._snapshots[event.run_id]  # a gap: rebuilt from the log when asked

    def _cache(self, snap: RunSnapshot) -> RunSnapshot:
        self._snapshots[snap.run_id] = snap
        if len(self._snapshots) > self._max_runs:
            self._snapshots.popitem(last=False)
        return snap

    # -- reading --------------------------------------------------------------------------

    async def _read(self, run_id: str, after: int, limit: int | None = None) -> list[BusEvent]:
        limit = limit or _PAGE
        if not self.persist:
            return self._memlog.get(run_id, [])[after : after + limit]
        assert self._store is not None
        events = await self._store.read_events(self.tenant, run_id, after_seq=after, limit=limit)
        return [_from_store(e) for e in events]

    def subscribe(
        self,
        run_id: str | None = None,
        streams: Collection[str] | None = None,
        from_seq: int | None = None,
        *,
        buffer: int | None = None,
        catch_up: bool = True,
    ) -> Subscription:
        """Events of one run (or of all runs, live only), optionally of some streams only.

        ``from_seq`` (run subscribers only) first replays the logged events after that
        seq (0: the whole run). The subscription is live from this call on.
        """
        if from_seq is not None and (run_id is None or from_seq < 0):
            raise InvalidInputError(
                f"from_seq={from_seq} needs a run_id and must be >= 0: an all-runs "
                "subscriber is live only; replay each run with its own subscription"
            )
        if run_id is not None:
            validate_id(run_id, "run id")
        wanted = None if streams is None else frozenset(streams)
        sub = Subscription(self, run_id, wanted, from_seq, buffer or self.buffer, catch_up)
        if run_id is None:
            self._all.add(sub)
        else:
            self._by_run.setdefault(run_id, set()).add(sub)
        return sub

    def _detach(self, sub: Subscription) -> None:
        if sub.run_id is None:
            self._all.discard(sub)
        elif (subs := self._by_run.get(sub.run_id)) is not None:
            subs.discard(sub)
            if not subs:
                del self._by_run[sub.run_id]

    # -- waiting and polling --------------------------------------------------------------

    async def snapshot(self, run_id: str) -> RunSnapshot:
        """A copy of the run's snapshot, rebuilt from the log if it is not cached."""
        snap = self._snapshots.get(validate_id(run_id, "run id"))
        if snap is None:
            snap, after = RunSnapshot(run_id), 0
            while page := await self._read(run_id, after):
                for event in page:
                    snap.apply(event)
                after = page[-1].seq
            cached = self._snapshots.get(run_id)
            snap = self._cache(snap) if cached is None or cached.last_seq < after else cached
        return replace(snap, last_by_stream=dict(snap.last_by_stream))

    async def latest(self, run_id: str, stream: str | None = None) -> BusEvent | None:
        """The run's last event (of ``stream`` if given), or None."""
        last = (await self.snapshot(run_id)).last_by_stream
        return last.get(stream) if stream else max(last.values(), key=lambda e: e.seq, default=None)

    async def wait_for(
        self,
        run_id: str,
        predicate: Callable[[BusEvent], bool],
        timeout: float | None = None,
        *,
        streams: Collection[str] | None = None,
        after_seq: int = 0,
        poll_interval: float | None = None,
    ) -> BusEvent:
        """The first event of the run after ``after_seq`` (logged or to come) that matches.

        Raises `WaitTimeoutError` after ``timeout`` seconds. ``poll_interval`` (seconds)
        re-reads the log that often, for runs that other processes publish.
        """
        poller: asyncio.Task[None] | None = None
        try:
            async with asyncio.timeout(timeout):
                with self.subscribe(run_id, streams, from_seq=after_seq) as sub:
                    if poll_interval is not None:
                        poller = asyncio.create_task(poll_every(sub, poll_interval))
                    async for event in sub:
                        if predicate(event):
                            return event
        except TimeoutError:
            raise WaitTimeoutError(f"no matching event of run {run_id!r} in {timeout} s") from None
        finally:
            if poller is not None:
                poller.cancel()
        raise StatekeeperError(f"the event bus closed while waiting for run {run_id!r}")

    async def wait_for_completion(
        self, run_id: str, timeout: float | None = None, *, poll_interval: float | None = None
    ) -> BusEvent:
        """The run's lifecycle end or abort event, waiting for it if the run goes on."""
        snap = self._snapshots.get(validate_id(run_id, "run id"))
        if snap is not None and snap.ended:
            return snap.last_by_stream["lifecycle"]
        return await self.wait_for(
            run_id,
            lambda e: e.terminal,
            timeout,
            streams=("lifecycle",),
            after_seq=0 if snap is None else snap.last_seq,
            poll_interval=poll_interval,
        )

    # -- housekeeping ---------------------------------------------------------------------

    async def delete_run(self, run_id: str) -> None:
        """Delete a run's log and snapshot, and close its subscribers."""
        for sub in tuple(self._by_run.get(validate_id(run_id, "run id"), ())):
            sub.close()
        self._ahead.forget(run_id)
        self._memlog.pop(run_id, None)
        self._snapshots.pop(run_id, None)
        if self._store is not None and self.persist:
            await self._store.delete_event_log(self.tenant, run_id)

    async def aclose(self) -> None:
        """Finish pending publishes (and log the events published ahead), then close
        every subscription."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(StatekeeperError):
            await self.flush_ahead()
        for sub in [*self._all, *(s for subs in self._by_run.values() for s in subs)]:
            sub.close()
