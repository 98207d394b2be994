"""Objects that implement one slice of the store protocol and nothing else, to prove that a
runtime component asks only for the slice it uses (a whole `Store` is never needed)."""

from __future__ import annotations

from statekeeper.stores.base import EventLogStore, RecordStore


class RecordsOnly:
    """The `RecordStore` methods of another store, and no other attribute."""

    __slots__ = ("delete_record", "get_record", "list_records", "put_record")

    def __init__(self, store: RecordStore) -> None:
        self.get_record = store.get_record
        self.put_record = store.put_record
        self.list_records = store.list_records
        self.delete_record = store.delete_record


class EventLogOnly:
    """The `EventLogStore` methods of another store, and no other attribute."""

    __slots__ = ("append_events", "delete_event_log", "read_events")

    def __init__(self, store: EventLogStore) -> None:
        self.append_events = store.append_events
        self.read_events = store.read_events
        self.delete_event_log = store.delete_event_log
