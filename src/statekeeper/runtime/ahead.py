"""Events fanned out ahead of their write: seen in process at once, logged later.

`EventBus.publish_ahead` gives an event the seq it will have in the run's log (the last
seq this bus knows for the run, plus one per event already ahead) and fans it out at
once; the run's next write through the bus logs it first (`EventBus.publish`,
`EventBus.publish_with`: the runner's step commit, `EventBus.flush_ahead`). So a tool's
``call_start`` reaches this process's subscribers before the tool runs, and costs no
write of its own.

When that write logs the events under other seqs (another process logged events of the
run in between) or may not have logged them (it failed or was cancelled), the run's
subscribers are sent back to the first of those seqs and read the log again from there:
they see what was logged in its place, and may see an early event a second time (with
its logged seq) or see one that was never logged. This module keeps the bookkeeping;
the bus does the writes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from statekeeper.runtime.event_types import BusEvent
from statekeeper.stores.base import Event, EventDraft, EventLogStore

__all__ = ["AheadLog", "drafts_of", "write_ahead"]


class AheadLog:
    """Per run: the last seq this bus knows was logged, and the events fanned out ahead."""

    def __init__(self, max_runs: int) -> None:
        self._last: OrderedDict[str, int] = OrderedDict()
        self._events: dict[str, list[BusEvent]] = {}
        self._max = max_runs

    def logged(self, run_id: str, seq: int) -> None:
        """The run's log holds events up to ``seq`` (this bus wrote or read them)."""
        if seq > self._last.get(run_id, 0):
            self._last[run_id] = seq
            self._last.move_to_end(run_id)
            if len(self._last) > self._max:
                self._last.popitem(last=False)

    def next_seq(self, run_id: str) -> int | None:
        """The seq an event of the run published ahead now would get; None if unknown
        (this bus has not written the run's log yet): then it is written at once."""
        last = self._last.get(run_id)
        if last is None:
            return None
        return last + len(self._events.get(run_id, ())) + 1

    def add(self, event: BusEvent) -> None:
        self._events.setdefault(event.run_id, []).append(event)

    def take(self, run_id: str) -> list[BusEvent]:
        """The run's events ahead (oldest first), to go first in the write being made."""
        return self._events.pop(run_id, [])

    def has(self, run_id: str) -> bool:
        return run_id in self._events

    def runs(self) -> list[str]:
        """The runs with events ahead."""
        return list(self._events)

    def forget(self, run_id: str) -> None:
        self._last.pop(run_id, None)
        self._events.pop(run_id, None)

    def settle(self, ahead: Sequence[BusEvent], logged: Sequence[Event] | None) -> bool:
        """After a write that carried ``ahead``: True if it logged them as announced;
        False if not (``logged`` None: the write failed, and may or may not have logged
        them), when the run's subscribers must read the log again from the first."""
        if not ahead:
            return True
        run_id = ahead[0].run_id
        if logged is not None and [e.seq for e in logged] == [e.seq for e in ahead]:
            self.logged(run_id, ahead[-1].seq)
            return True
        if logged:
            self._last[run_id] = logged[-1].seq
        else:
            self._last.pop(run_id, None)  # unknown: the next event is written at once
        return False


def drafts_of(events: Sequence[BusEvent]) -> list[EventDraft]:
    """The drafts that log ``events`` (published ahead) as they were announced."""
    return [
        EventDraft.model_construct(stream=e.stream, kind=e.kind, payload=e.payload, ts=e.ts)
        for e in events
    ]


async def write_ahead(
    store: EventLogStore,
    tenant: str,
    ahead: list[BusEvent],
    drafts: list[EventDraft],
    settle: Callable[[Sequence[Event] | None], None],
    refused: tuple[type[Exception], ...],
) -> Event:
    """Log ``ahead`` (one run's events published ahead) then ``drafts`` in one batch;
    the last event logged. ``settle`` gets what was logged for ``ahead`` (None: unknown).
    When the batch is ``refused`` (for ``drafts``: ``ahead`` were checked when
    published), ``ahead`` is logged alone and the error raised."""
    run_id = ahead[0].run_id
    try:
        stored = await store.append_events(tenant, run_id, [*drafts_of(ahead), *drafts])
    except refused:
        if not drafts:
            settle(None)
            raise
        try:
            alone = await store.append_events(tenant, run_id, drafts_of(ahead))
        except BaseException:
            settle(None)
            raise
        settle(alone)
        raise
    except BaseException:
        settle(None)
        raise
    settle(stored[: len(ahead)])
    return stored[-1]
