"""Reading a session's events: the whole log, the last n, or those from a time on.

The log has no index on event time, so ``after_timestamp`` would read every event to
filter them. Instead each append records whether the session's events are still in
timestamp order (metadata ``adk.ordered``: every event appended through the service
has a timestamp at least its predecessor's). While they are, the log is read back from
its end in pages that double (8, 16, 32 ... entries) until a page starts before the
time: k events selected cost at most 2k + 8 entries read, whatever the log's length,
and only the k are built. Otherwise (a session that has had an event out of order, one
written before this flag existed, an entry of another kind at the start of a page) the
whole log is read and filtered, as ADK's services filter it.

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
from statekeeper.stores.base import Entry, SessionRecord

__all__ = ["Order", "marker", "order_after", "order_of", "parse_marker", "read_events"]

_MARKER = "statekeeper:"
_EMPTY = "-"
_FIRST_PAGE = 8
"""Entries read first from the end of a log for ``after_timestamp``."""

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
    # Every read ends at the record's last entry: the events of the version the
    # session object is marked with (and a read of known length is cheaper: a store
    # may run a short one without a hop to another thread).
    last = record.last_seq
    if after is None:
        entries = await store.read_entries(tenant, record.id, after_seq=start, until_seq=last)
    elif not order_of(record)[0]:
        entries = await store.read_entries(tenant, record.id, until_seq=last)
    else:
        entries = await _from_time(store, tenant, record, start, after)
    with gc_paused():  # thousands of acyclic models: see `gc_paused`
        events = [decode_event(e) for e in entries if after is None or not _earlier(e, after)]
    if after is not None:
        events = [e for e in events if e.timestamp >= after]
    if recent is not None:
        events = events[-recent:]
    return events


def _stamp(entry: Entry) -> float | None:
    stamp = entry.payload.get("timestamp") if entry.kind == EVENT_KIND else None
    return None if isinstance(stamp, bool) or not isinstance(stamp, int | float) else stamp


def _earlier(entry: Entry, after: float) -> bool:
    """An event stored with a timestamp before ``after``: never selected, so not built
    (whether or not it would read back)."""
    stamp = _stamp(entry)
    return stamp is not None and stamp < after


async def _from_time(
    store: Store, tenant: str, record: SessionRecord, start: int, after: float
) -> list[Entry]:
    """The entries after ``start`` from the first event at or after ``after`` on, and
    fewer earlier ones than that, in a log whose events are in timestamp order."""
    # Pages back from the end, each twice the one before, until one starts earlier
    # than the time: k events cost at most 2k + 8 entries read, in O(log k) reads.
    last = record.last_seq
    high, size = last, _FIRST_PAGE
    pages: list[list[Entry]] = []
    while high > start:
        low = max(start, high - size)
        page = await store.read_entries(tenant, record.id, after_seq=low, until_seq=high)
        pages.append(page)
        if page:
            first = _stamp(page[0])
            if first is None:  # an entry that is not an event: read it all
                return await store.read_entries(tenant, record.id, until_seq=last)
            if first < after:
                break
        high, size = low, size * 2
    return [entry for page in reversed(pages) for entry in page]
