"""Subscriptions to the event bus: per-subscriber buffering, replay and catch-up.

**Subscribers** get events in seq order. A run subscriber may pass ``from_seq``: it
replays the logged events after it, then goes on live with no gap and no repeat. An
all-runs subscriber (``run_id=None``) is live only; replay is per run.

**Slow subscribers** never block a publisher and hold at most ``buffer`` events. A full
run subscriber drops its buffer and catches up from the log on its next read
(``catch_up=True``, the default): its consumer still sees every event, in order. With
``catch_up=False``, and for all-runs subscribers, a full buffer detaches the subscriber:
it delivers what it holds, then raises `SubscriberLaggedError` with the last seq
delivered (per run), so a new subscription ``from_seq`` there misses nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from typing import Protocol, Self

from statekeeper.runtime.event_types import BusEvent, RunSnapshot, SubscriberLaggedError

__all__ = ["Subscription"]


class _Bus(Protocol):
    """What a subscription calls back into: `statekeeper.runtime.events.EventBus` (named
    by shape, since the bus imports this module)."""

    @property
    def _snapshots(self) -> Mapping[str, RunSnapshot]: ...

    async def _read(self, run_id: str, after: int, limit: int | None = None) -> list[BusEvent]: ...

    def _detach(self, sub: Subscription) -> None: ...


class Subscription:
    """An async iterator of a bus's events; close it (or use ``async with``) when done."""

    def __init__(
        self,
        bus: _Bus,
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
        self._polls = 0  # poll requests so far: one made while a read is under way re-reads
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
                polls = self._polls
                page = await self._bus._read(self.run_id, self._pos or 0)
                if page:
                    self._pos = page[-1].seq
                    self._replay.extend(e for e in page if self._wants(e))
                elif polls == self._polls:  # a poll during the read may have missed its event
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

    def _void(self, run_id: str, seq: int) -> None:
        """Events of ``run_id`` from ``seq`` on were fanned out ahead of a write that did
        not log them so: drop those not delivered yet and read the log from there."""
        self._live = deque(e for e in self._live if e.run_id != run_id or e.seq < seq)
        if self.run_id is not None and self._pos is not None and self._pos >= seq:
            self._pos = seq - 1
            self._replaying = True
            self._wake()

    def poll(self) -> None:
        """Read the log for events other processes logged (run subscribers only)."""
        self._replaying = self.run_id is not None
        self._polls += 1
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


async def poll_every(sub: Subscription, interval: float) -> None:
    """Make ``sub`` re-read its run's log every ``interval`` seconds (until cancelled)."""
    while True:
        await asyncio.sleep(interval)
        sub.poll()
