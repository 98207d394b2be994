"""Reading a session's events: the whole log, the last n, or those from a time on.

The log has no index on event time, so ``after_timestamp`` would read every event to
filter them. Instead each append records whether the session's events are still in
timestamp order (metadata ``adk.ordered``: every event appended through the service
has a timestamp at least its predecessor's). While they are, the first event at or
after a time is found by a binary search of one-entry reads, and only the events from
there are read. Otherwise (a session that has had an event out of order, one written
before this flag existed, an entry of another kind met on the way) the whole log is
read and filtered, as ADK's services filter it.

What an append needs to keep the flag (is the log ordered, and the last event's
timestamp) travels in the session object's storage marker, so an append through a
session object this service returned reads nothing first: the marker names the version
it was read at, and the append only lands on that version.
"""

from __future__ import annotations

from google.adk.events import Event
from google.adk.sessions.base_session_service import GetSessionConfig

from statekeeper.integrations.adk._codec import EVENT_KIND, ORDER_KEY, UPDATED_KEY, decode_event
from statekeeper.jsoncodec import gc_paused
from statekeeper.stores import Store
from statekeeper.stores.base import SessionRecord

__all__ = ["Order", "marker", "order_after", "order_of", "parse_marker", "read_events"]

_MARKER = "statekeeper:"
_EMPTY = "-"

Order = tuple[bool, float | None]
"""Whether the stored events are in timestamp order, and the last one's timestamp (None
for no events). ``(False, None)`` when they are not, or nobody knows."""

UNORDERED: Order = (False, None)


def order_of(record: SessionRecord) -> Order:
    """The order facts of a stored session."""
    if record.metadata.get(ORDER_KEY) is not True:
        return UNORDERED
    if record.last_seq == 0:
        return (True, None)
    last = record.metadata.get(UPDATED_KEY)  # an append sets it to the event's timestamp
    if isinstance(last, bool) or not isinstance(last, int | float):
        return UNORDERED
    return (True, float(last))


def order_after(order: Order, timestamp: float) -> bool:
    """Whether the log is still in order once an event of ``timestamp`` is appended."""
    ordered, last = order
    return ordered and (last is None or timestamp >= last)


def marker(record: SessionRecord) -> str:
    """The storage marker of a session object read at ``record``'s version."""
    ordered, last = order_of(record)
    if not ordered:
        return f"{_MARKER}{record.version}"
    return f"{_MARKER}{record.version}:{_EMPTY if last is None else repr(last)}"


def parse_marker(text: str | None) -> tuple[int, Order] | None:
    """The version and order facts a marker of this service holds (None for another
    service's marker, or none)."""
    if not text or not text.startswith(_MARKER):
        return None
    version, _, last = text[len(_MARKER) :].partition(":")
    if not version.isdigit():
        return None
    if not last:
        return int(version), UNORDERED
    if last == _EMPTY:
        return int(version), (True, None)
    try:
        return int(version), (True, float(last))
    except ValueError:
        return int(version), UNORDERED


async def read_events(
    store: Store, tenant: str, record: SessionRecord, config: GetSessionConfig | None
) -> list[Event]:
    """The session's events as ``config`` selects them, in append order."""
    recent = config.num_recent_events if config else None
    after = config.after_timestamp if config else None
    if recent == 0:
        return []
    # One entry per event, numbered from 1: the last n events are the last n seqs.
    start = max(0, record.last_seq - recent) if recent is not None else 0
    if after is not None:
        first = await _before(store, tenant, record, after) if order_of(record)[0] else None
        start = 0 if first is None else max(start, first)
    entries = await store.read_entries(tenant, record.id, after_seq=start)
    with gc_paused():  # thousands of acyclic models: see `gc_paused`
        events = [decode_event(e) for e in entries]
    if after is not None:
        events = [e for e in events if e.timestamp >= after]
    if recent is not None:
        events = events[-recent:]
    return events


async def _before(store: Store, tenant: str, record: SessionRecord, after: float) -> int | None:
    """A seq such that every event up to it is earlier than ``after`` and none after it
    is (events in timestamp order); None when an entry met is not an event."""
    low, high = 0, record.last_seq  # events up to low: earlier; after high: not earlier
    while low < high:
        middle = (low + high) // 2
        found = await store.read_entries(tenant, record.id, after_seq=middle, limit=1)
        if not found or found[0].seq > high:
            high = middle
            continue
        entry = found[0]
        stamp = entry.payload.get("timestamp") if entry.kind == EVENT_KIND else None
        if isinstance(stamp, bool) or not isinstance(stamp, int | float):
            return None
        if stamp < after:
            low = entry.seq
        else:
            high = middle
    return low
