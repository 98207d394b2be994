"""The event bus: typed, per-run ordered events with replay, for UIs, polling and waits.

Built-in streams (another kind on these raises `UnknownEventKindError`; other stream
names are custom and take any kind)::

    lifecycle   start, end, abort, status     status needs payload["status"]: str
    tool        call_start, result, error     needs payload["tool"]: str
    assistant   partial, complete             needs payload["text"]: str
    error       error                         needs payload["message"]: str
    compaction  start, complete

**Seqs** are per run, from 1, without gaps or repeats: from the store's event log (log id
= run id, shared by every process on the store), or with ``persist=False`` from an
in-memory log per run. A non-JSON payload raises `InvalidPayloadError` before anything is
stored and uses no seq. Publishes to a run that arrive while a write to it is under way
are written together, as one batch.

**Subscribers** get events in seq order. A run subscriber may pass ``from_seq``: it
replays the logged events after it, then goes on live with no gap and no repeat. An
all-runs subscriber (``run_id=None``) is live only; replay is per run.

**Slow subscribers** never block a publisher and hold at most ``buffer`` events. A full
run subscriber drops its buffer and catches up from the log on its next read
(``catch_up=True``, the default): its consumer still sees every event, in order. With
``catch_up=False``, and for all-runs subscribers, a full buffer detaches the subscriber:
it delivers what it holds, then raises `SubscriberLaggedError` with the last seq
delivered (per run), so a new subscription ``from_seq`` there misses nothing.

**Other processes'** events reach a run subscriber here when it sees a gap in the seqs
(this process published after them), on `Subscription.poll` / `EventBus.refresh`, or
with ``wait_for(poll_interval=...)``; replay always sees them. All-runs subscribers get
this process's events only.
"""

# ruff: noqa: ASYNC109 (wait_for's timeout is the documented API)
from __future__ import annotations

import asyncio
import contextlib
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final, Self

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidInputError, InvalidPayloadError, StatekeeperError
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import encode_json, loads
from statekeeper.stores.base import Event, EventDraft, Store

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

STREAM_KINDS: Final[Mapping[str, frozenset[str]]] = {
    "lifecycle": frozenset({"start", "end", "abort", "status"}),
    "tool": frozenset({"call_start", "result", "error"}),
    "assistant": frozenset({"partial", "complete"}),
    "error": frozenset({"error"}),
    "compaction": frozenset({"start", "complete"}),
}
_NEEDS: Final = {"tool": "tool", "assistant": "text", "error": "message", "lifecycle": None}
_RULES: Final = {
    (stream, kind): "status" if kind == "status" else _NEEDS.get(stream)
    for stream, kinds in STREAM_KINDS.items()
    for kind in kinds
}
_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
_TERMINAL: Final = frozenset({"end", "abort"})
_PAGE = 256


class UnknownEventKindError(InvalidInputError):
    """A kind that the named built-in stream does not have, or an invalid stream name."""


class SubscriberLaggedError(StatekeeperError):
    """A subscriber fell ``buffer`` events behind and was detached, after delivering
    what it held. ``last_seq``: the last seq a run subscriber delivered; ``positions``:
    run id -> seq after which events were dropped (resubscribe there with ``from_seq``).
    An all-runs subscriber also misses later events of any run: resubscribe each run
    of interest from the last seq its consumer saw.
    """

    def __init__(self, run_id: str | None, last_seq: int | None, positions: dict[str, int]):
        super().__init__(
            f"subscriber to {f'run {run_id!r}' if run_id else 'all runs'} fell behind its "
            f"buffer and was detached; resubscribe with from_seq (dropped after: {positions})"
        )
        self.run_id, self.last_seq, self.positions = run_id, last_seq, positions


class WaitTimeoutError(StatekeeperError, TimeoutError):
    """No matching event arrived before the timeout."""


@dataclass(frozen=True, slots=True)
class BusEvent:
    """One event of a run. Treat ``payload`` as read-only: subscribers share it."""

    run_id: str
    seq: int
    stream: str
    kind: str
    ts: datetime
    payload: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """JSON data for a wire (the UI stream)."""
        return {name: getattr(self, name) for name in self.__slots__} | {"ts": self.ts.isoformat()}

    @property
    def terminal(self) -> bool:
        """True for lifecycle end or abort: the run is over."""
        return self.stream == "lifecycle" and self.kind in _TERMINAL


@dataclass(slots=True)
class RunSnapshot:
    """What the events of a run say so far (for wait/poll without reading the log)."""

    run_id: str
    last_seq: int = 0
    status: str | None = None
    """"running" after start, payload["status"] of status/end events, "aborted" on abort."""
    ended: bool = False
    updated_at: datetime | None = None
    last_assistant: str | None = None
    last_error: str | None = None
    last_by_stream: dict[str, BusEvent] = field(default_factory=dict)

    def apply(self, event: BusEvent) -> None:
        """Fold in the next event."""
        self.last_seq, self.updated_at = event.seq, event.ts
        self.last_by_stream[event.stream] = event
        payload = event.payload
        if event.stream == "lifecycle":
            if event.kind == "start":
                self.status = str(payload.get("status", "running"))
            elif event.kind in ("status", "end"):
                self.status = str(payload.get("status", "completed"))
            elif event.kind == "abort":
                self.status = "aborted"
            self.ended = self.ended or event.kind in _TERMINAL
        elif event.stream == "assistant" and event.kind == "complete":
            self.last_assistant = payload["text"]
        elif event.stream == "error":
            self.last_error = payload["message"]


def check_event(stream: str, kind: str, payload: Mapping[str, Any]) -> None:
    """Raise a typed error unless ``stream``, ``kind`` and ``payload`` make a valid event."""
    try:
        key = _RULES[stream, kind]
    except (KeyError, TypeError):
        if (kinds := STREAM_KINDS.get(stream) if isinstance(stream, str) else None) is not None:
            raise UnknownEventKindError(
                f"stream {stream!r} has no kind {kind!r}; use one of {', '.join(sorted(kinds))}"
            ) from None
        for what, name in (("stream", stream), ("event kind", kind)):
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise UnknownEventKindError(
                    f"invalid {what} {name!r}: use [a-z][a-z0-9_.-]*"
                ) from None
        key = None
    if not isinstance(payload, Mapping):
        raise InvalidPayloadError(f"an event payload must be a JSON object, not {type(payload)}")
    if key is not None and not isinstance(payload.get(key), str):
        raise InvalidPayloadError(f"{stream}/{kind} events need payload[{key!r}] as a string")


class Subscription:
    """An async iterator of a bus's events; close it (or use ``async with``) when done."""

    def __init__(
        self,
        bus: EventBus,
        run_id: str | None,
        streams: frozenset[str] | None,
        from_seq: int | None,
        buffer: int,
        catch_up: bool,
    ) -> None:
        self.run_id, self.streams = run_id, streams
        self._bus, self._limit = bus, buffer
        self._catch_up = catch_up and run_id is not None
        self._live: deque[BusEvent] = deque()
        self._replay: deque[BusEvent] = deque()
        self._pos = from_seq  # run subscribers: the last seq read or delivered
        if from_seq is None and run_id is not None and (snap := bus._snapshots.get(run_id)):
            self._pos = snap.last_seq  # live from here (what a poll reads after)
        self._replaying = from_seq is not None
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._lagged = False
        self._dropped: dict[str, int] = {}  # the first event that did not fit, as a position

    def _wants(self, event: BusEvent) -> bool:
        return self.streams is None or event.stream in self.streams

    def _push(self, event: BusEvent) -> None:
        """Called by the bus for each live event; never blocks, never grows past the limit."""
        if len(self._live) < self._limit:
            self._live.append(event)
        elif self._catch_up:
            if self._pos is None:
                self._pos = self._live[0].seq - 1
            self._live.clear()  # re-read from the log instead of holding events
            self._replaying = True
        else:
            self._lagged = True
            self._dropped = {event.run_id: event.seq - 1}
            self._bus._detach(self)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> BusEvent:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._replay:
                return self._replay.popleft()
            if self._replaying and self.run_id is not None:
                page = await self._bus._read(self.run_id, self._pos or 0)
                if page:
                    self._pos = page[-1].seq
                    self._replay.extend(e for e in page if self._wants(e))
                else:
                    self._replaying = False
                continue
            if self._live:
                event = self._live.popleft()
                if self.run_id is not None:  # run subscribers get every event, to see gaps
                    if self._pos is not None and event.seq != self._pos + 1:
                        # <= pos: the replay delivered it; > pos + 1: another process
                        # logged the events between, so read them from the log.
                        self._replaying = event.seq > self._pos
                        continue
                    self._pos = event.seq
                    if not self._wants(event):
                        continue
                return event
            if self._lagged:
                self.close()
                raise SubscriberLaggedError(self.run_id, self._pos, self._dropped)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def poll(self) -> None:
        """Read the log for events other processes logged (run subscribers only)."""
        self._replaying = self.run_id is not None
        self._wake()

    def close(self) -> None:
        """Stop receiving; a pending ``__anext__`` ends the iteration. Idempotent."""
        self._closed = True
        self._bus._detach(self)
        self._wake()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


_Pending = list[tuple[EventDraft, asyncio.Future[BusEvent]]]


def _from_store(event: Event) -> BusEvent:
    return BusEvent(event.log_id, event.seq, event.stream, event.kind, event.ts, event.payload)


class EventBus:
    """Publish and subscribe to the events of runs, for one tenant.

    Args:
        store: where events are logged (log id = run id) when ``persist`` is true.
        persist: False keeps each run's log in this process's memory only (until
            `delete_run`), for tests and ephemeral runs.
        buffer: the default number of events a subscriber may hold before it lags.
        max_cached_runs: run snapshots kept in memory (least recently updated dropped).
        clock: the timestamp source (timezone-aware).
    """

    def __init__(
        self,
        store: Store | None,
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

    # -- publishing -----------------------------------------------------------------------

    async def publish(
        self, run_id: str, stream: str, kind: str, payload: Mapping[str, Any] | None = None
    ) -> BusEvent:
        """Log an event with the run's next seq, fan it out and return it.

        Raises `UnknownEventKindError` or `InvalidPayloadError` (nothing stored, no seq
        used). A publish cancelled while writing may still log its event (the store
        finishes a write it started); the run's subscribers then read it from the log.
        """
        if run_id not in self._snapshots:  # cached runs were validated before
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
            [stored] = await self._store.append_events(self.tenant, run_id, [draft])
            self._fan_out(event := _from_store(stored))
            return event
        except asyncio.CancelledError:
            self.refresh(run_id)  # it may be logged anyway: the run's subscribers re-read
            raise
        finally:
            if self._pending[run_id]:  # publishes that arrived meanwhile: one batch
                task = asyncio.create_task(self._drain(run_id))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                del self._pending[run_id]

    def refresh(self, run_id: str) -> None:
        """Make the run's subscribers read what other processes logged; drop its snapshot."""
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

    def _fan_out(self, event: BusEvent) -> None:
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
                        poller = asyncio.create_task(_poll(sub, poll_interval))
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
        self._memlog.pop(run_id, None)
        self._snapshots.pop(run_id, None)
        if self._store is not None and self.persist:
            await self._store.delete_event_log(self.tenant, run_id)

    async def aclose(self) -> None:
        """Finish pending publishes, then close every subscription."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in [*self._all, *(s for subs in self._by_run.values() for s in subs)]:
            sub.close()


async def _poll(sub: Subscription, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        sub.poll()
