"""A comparable picture of what a store holds for one tenant.

`snapshot` reads every session head, every transcript entry, the records of the given
namespaces and the events of the given logs, as plain JSON-ready data. Take one before a
call and one after: a call that failed must leave the two equal ("a failed call changes
nothing"). The store protocol cannot enumerate namespaces or event logs, so the caller
names the ones that matter (`DEFAULT_NAMESPACES` covers the library's own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from statekeeper.errors import NotFoundError
from statekeeper.stores.base import SessionQuery, Store

__all__ = ["DEFAULT_NAMESPACES", "snapshot"]

DEFAULT_NAMESPACES = ("runs", "state.user", "state.app")
"""Record namespaces the library itself writes (run indexes, scoped state)."""


async def snapshot(
    store: Store,
    tenant: str,
    *,
    namespaces: Iterable[str] = DEFAULT_NAMESPACES,
    event_logs: Iterable[str] = (),
) -> dict[str, Any]:
    """Sessions (head and entries), records and events of ``tenant``, as plain data
    (a damaged session head or record as its stored text)."""
    sessions: dict[str, Any] = {}
    cursor: str | None = None
    while True:
        page = await store.list_sessions(tenant, SessionQuery(limit=1000, cursor=cursor))
        for record in page.items:
            entries = await store.read_entries(tenant, record.id)
            sessions[record.id] = {
                "head": record.model_dump(mode="json"),
                "entries": [_entry(e) for e in entries],
            }
        for item in page.corrupt:  # a damaged head is part of the picture too
            sessions[item.id] = {"corrupt": item.raw}
        cursor = page.next_cursor
        if cursor is None:
            break
    records = {namespace: await _all_records(store, tenant, namespace) for namespace in namespaces}
    events: dict[str, Any] = {}
    for log_id in event_logs:
        try:
            found = await store.read_events(tenant, log_id)
        except NotFoundError:
            found = []
        events[log_id] = [_event(e) for e in found]
    return {"sessions": sessions, "records": records, "events": events}


def _entry(entry: Any) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "id": entry.id,
        "parent_seq": entry.parent_seq,
        "kind": str(entry.kind),
        "created_at": entry.created_at.isoformat(),
        "payload": entry.payload,
    }


def _event(event: Any) -> dict[str, Any]:
    fields = dataclasses.asdict(event)
    fields["ts"] = fields["ts"].isoformat()
    return fields


async def _all_records(store: Store, tenant: str, namespace: str) -> list[Any]:
    out: list[Any] = []
    after: str | None = None
    while True:
        batch = await store.list_records(tenant, namespace, after_key=after, limit=500)
        out += [r.model_dump(mode="json") for r in batch]
        out += [{"corrupt": item.id, "raw": item.raw} for item in getattr(batch, "corrupt", [])]
        if len(batch) < 500:
            return out
        after = batch[-1].key
