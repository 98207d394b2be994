"""The event bus: typed, per-run ordered events with replay, for UIs, polling and waits.

Built-in streams and kinds (another kind on these raises `UnknownEventKindError`; other
stream names are custom and take any kind)::

    lifecycle   start, end, abort, status     status needs payload["status"]: str
    tool        call_start, result, error     needs payload["tool"]: str
    assistant   partial, complete             needs payload["text"]: str
    error       error                         needs payload["message"]: str
    compaction  start, complete

**Seqs** are per run, from 1, without gaps or repeats. With ``persist=True`` they come
from the store's event log (log id = run id), shared by every process on the store; with
``persist=False`` an in-memory log per run does the same. A non-JSON payload raises
`InvalidPayloadError` before anything is stored and uses no seq. Concurrent publishes to
a run are written in batches (one store call each) and fanned out in seq order.

**Subscribers** get events in seq order. A run subscriber may pass ``from_seq``: it
replays the logged events after it, then goes on live with no gap and no repeat. An
all-runs subscriber (``run_id=None``) is live only; replay is per run.

**Slow subscribers** never block a publisher and hold at most ``buffer`` events. A run
subscriber whose buffer fills drops it and catches up from the log on its next read
(``catch_up=True``, the default): its consumer still sees every event, in order. With
``catch_up=False``, and always for all-runs subscribers, a full buffer detaches the
subscriber: it delivers what it holds, then raises `SubscriberLaggedError` with the last
seq delivered (per run), so a new subscription with ``from_seq`` misses nothing.

**Other processes'** events reach live subscribers here when this process next
publishes to the run, or on `EventBus.refresh`; replay always sees them.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import TracebackType
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
    """A subscriber fell ``buffer`` events behind and was detached.

    Resubscribe with ``from_seq=last_seq`` (run subscriber) or, per run, with
    ``from_seq=positions[run_id]`` (all-runs subscriber) to miss nothing.
    """

    def __init__(self, run_id: str | None, last_seq: int | None, positions: dict[str, int]):
        where = f"run {run_id!r}" if run_id else "all runs"
        super().__init__(
            f"subscriber to {where} fell behind its buffer and was detached; resubscribe "
            f"with from_seq (last delivered: {last_seq if run_id else positions})"
        )
        self.run_id = run_id
        self.last_seq = last_seq
        self.positions = positions


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
                raise UnknownEventKindError(f"invalid {what} {name!r}: use [a-z][a-z0-9_.-]*")
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
        self._replaying = from_seq is not None
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._lagged = False
        self._positions: OrderedDict[str, int] = OrderedDict()  # all-runs: last delivered

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
            self._positions.setdefault(event.run_id, event.seq - 1)
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
                page = await self._bus._read(self.run_id, self._pos or 0, _PAGE)
                if page:
                    self._pos = page[-1].seq
                    self._replay.extend(e for e in page if self._wants(e))
                else:
                    self._replaying = False
                continue
            if self._live:
                event = self._live.popleft()
                if self.run_id is None:
                    self._positions[event.run_id] = event.seq
                    self._positions.move_to_end(event.run_id)
                    if len(self._positions) > 4096 and not self._lagged:
                        self._positions.popitem(last=False)
                elif self._pos is not None and event.seq <= self._pos:
                    continue  # already delivered by the replay
                else:
                    self._pos = event.seq
                return event
            if self._lagged:
                self.close()
                raise SubscriberLaggedError(self.run_id, self._pos, dict(self._positions))
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

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

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_Pending = list[tuple[EventDraft | None, asyncio.Future[BusEvent | None]]]


class EventBus:
    """Publish and subscribe to the events of runs, for one tenant.

    Args:
        store: where events are logged (log id = run id) when ``persist`` is true.
        tenant: the tenant every event belongs to.
        persist: False keeps the per-run logs in this process's memory only (until
            `delete_run`), for tests and ephemeral runs.
        buffer: default number of events a subscriber may hold before it lags.
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
        if persist and store is None:
            raise InvalidInputError("a persistent EventBus needs a store (or persist=False)")
        if buffer < 1:
            raise InvalidInputError("buffer must be at least 1")
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
        """Log an event with the run's next seq and fan it out; return it.

        Raises `UnknownEventKindError` or `InvalidPayloadError` (nothing stored, no seq
        used). A cancelled caller does not cancel the write: the event is still published.
        """
        validate_id(run_id, "run id")
        payload = {} if payload is None else payload
        check_event(stream, kind, payload)
        text = encode_json(payload, what=f"event {stream}/{kind} payload")
        ts = self._clock()
        if not self.persist:
            log = self._memlog.setdefault(run_id, [])
            event = BusEvent(run_id, len(log) + 1, stream, kind, ts, loads(text))
            log.append(event)
            self._fan_out(event)
            return event
        # A private copy (the caller may change its dict before the batch is written).
        draft = EventDraft.model_construct(stream=stream, kind=kind, payload=loads(text), ts=ts)
        published = await self._enqueue(run_id, draft)
        assert published is not None
        return published

    async def refresh(self, run_id: str) -> None:
        """Fan out events that other processes logged for a run since this one last saw it."""
        if self.persist:
            if validate_id(run_id, "run id") not in self._snapshots:
                await self.snapshot(run_id)  # the starting point: what is logged now
            await self._enqueue(run_id, None)

    def _enqueue(self, run_id: str, draft: EventDraft | None) -> asyncio.Future[BusEvent | None]:
        future: asyncio.Future[BusEvent | None] = asyncio.get_running_loop().create_future()
        pending = self._pending.get(run_id)
        if pending is None:
            self._pending[run_id] = [(draft, future)]
            task = asyncio.create_task(self._drain(run_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            pending.append((draft, future))
        return future

    async def _drain(self, run_id: str) -> None:
        """Write the run's pending events in batches and fan each batch out, in seq order."""
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
        drafts = [d for d, _ in batch if d is not None]
        results: list[BusEvent | InvalidInputError] = []
        if len(drafts) > 1:
            try:
                written = await self._store.append_events(self.tenant, run_id, drafts)
                results = [self._to_bus(e) for e in written]
            except InvalidInputError:
                pass  # one bad draft (e.g. too large) must not fail the rest: one by one
        if not results:
            for one_draft in drafts:
                try:
                    [one] = await self._store.append_events(self.tenant, run_id, [one_draft])
                    results.append(self._to_bus(one))
                except InvalidInputError as exc:
                    results.append(exc)
        fresh = [r for r in results if isinstance(r, BusEvent)]
        snap = self._snapshots.get(run_id)
        until = fresh[0].seq - 1 if fresh else None
        if snap is not None and (until is None or snap.last_seq < until):
            # Events other processes logged since we last saw the run: fan them out first.
            after = snap.last_seq
            while missed := await self._read(run_id, after, _PAGE):
                for event in missed:
                    if until is None or event.seq <= until:
                        self._fan_out(event)
                after = missed[-1].seq
                if until is not None and after >= until:
                    break
        for event in fresh:
            self._fan_out(event)
        outcomes = iter(results)
        for draft, future in batch:
            result = next(outcomes) if draft is not None else None
            if future.done():
                continue
            if isinstance(result, InvalidInputError):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _fan_out(self, event: BusEvent) -> None:
        self._note(event)
        for sub in tuple(self._by_run.get(event.run_id, ())):
            if sub._wants(event):
                sub._push(event)
        for sub in tuple(self._all):
            if sub._wants(event):
                sub._push(event)

    def _note(self, event: BusEvent) -> None:
        """Keep the run's snapshot current (only from a complete, gap-free history)."""
        snap = self._snapshots.get(event.run_id)
        if snap is None and event.seq == 1:
            snap = self._snapshots[event.run_id] = RunSnapshot(event.run_id)
            if len(self._snapshots) > self._max_runs:
                self._snapshots.popitem(last=False)
        if snap is None or event.seq <= snap.last_seq:
            return
        if event.seq == snap.last_seq + 1:
            snap.apply(event)
            self._snapshots.move_to_end(event.run_id)
        else:
            del self._snapshots[event.run_id]  # a gap: rebuild from the log when asked

    # -- reading --------------------------------------------------------------------------

    def _to_bus(self, event: Event) -> BusEvent:
        return BusEvent(event.log_id, event.seq, event.stream, event.kind, event.ts, event.payload)

    async def _read(self, run_id: str, after: int, limit: int) -> list[BusEvent]:
        if not self.persist:
            return self._memlog.get(run_id, [])[after : after + limit]
        assert self._store is not None
        events = await self._store.read_events(self.tenant, run_id, after_seq=after, limit=limit)
        return [self._to_bus(e) for e in events]

    def subscribe(
        self,
        run_id: str | None = None,
        streams: Collection[str] | None = None,
        from_seq: int | None = None,
        *,
        buffer: int | None = None,
        catch_up: bool = True,
    ) -> Subscription:
        """Events of one run (or all runs: live only), optionally of some streams only.

        ``from_seq`` (run subscribers only) replays the logged events after that seq
        first (0: the whole run). The subscription is live from this call on.
        """
        if run_id is not None:
            validate_id(run_id, "run id")
        elif from_seq is not None:
            raise InvalidInputError(
                "from_seq needs a run_id: an all-runs subscriber is live only; "
                "replay each run with its own subscription"
            )
        if from_seq is not None and from_seq < 0:
            raise InvalidInputError(f"from_seq must be >= 0, not {from_seq}")
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
            while page := await self._read(run_id, after, _PAGE):
                for event in page:
                    snap.apply(event)
                after = page[-1].seq
            cached = self._snapshots.get(run_id)
            if cached is None or cached.last_seq < snap.last_seq:
                self._snapshots[run_id] = cached = snap
                if len(self._snapshots) > self._max_runs:
                    self._snapshots.popitem(last=False)
            snap = cached
        return replace(snap, last_by_stream=dict(snap.last_by_stream))

    async def latest(self, run_id: str, stream: str | None = None) -> BusEvent | None:
        """The run's last event (of ``stream`` if given), or None."""
        snap = await self.snapshot(run_id)
        if stream is not None:
            return snap.last_by_stream.get(stream)
        return max(snap.last_by_stream.values(), key=lambda e: e.seq, default=None)

    async def wait_for(
        self,
        run_id: str,
        predicate: Callable[[BusEvent], bool],
        timeout: float | None = None,  # noqa: ASYNC109 (the caller's deadline, documented)
        *,
        streams: Collection[str] | None = None,
        after_seq: int = 0,
    ) -> BusEvent:
        """The first event of the run (after ``after_seq``, logged or future) that matches.

        Raises `WaitTimeoutError` after ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout):
                with self.subscribe(run_id, streams, from_seq=after_seq) as sub:
                    async for event in sub:
                        if predicate(event):
                            return event
        except TimeoutError:
            raise WaitTimeoutError(
                f"no matching event of run {run_id!r} within {timeout} s"
            ) from None
        raise StatekeeperError(f"the event bus closed while waiting for run {run_id!r}")

    async def wait_for_completion(
        self,
        run_id: str,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> BusEvent:
        """The run's lifecycle end or abort event, waiting for it if the run is still going."""
        snap = self._snapshots.get(validate_id(run_id, "run id"))
        if snap is not None and snap.ended:
            return snap.last_by_stream["lifecycle"]
        after = 0 if snap is None else snap.last_seq
        return await self.wait_for(
            run_id, lambda e: e.terminal, timeout, streams=("lifecycle",), after_seq=after
        )

    # -- housekeeping ---------------------------------------------------------------------

    async def delete_run(self, run_id: str) -> None:
        """Delete a run's log and snapshot (its subscribers stay open)."""
        validate_id(run_id, "run id")
        self._memlog.pop(run_id, None)
        self._snapshots.pop(run_id, None)
        if self.persist and self._store is not None:
            await self._store.delete_event_log(self.tenant, run_id)

    async def aclose(self) -> None:
        """Finish pending publishes, then close every subscription."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in [*self._all, *(s for subs in self._by_run.values() for s in subs)]:
            sub.close()
