"""Listing the sessions of a sealed store: heads opened, and filters on sealed metadata.

A filter on a metadata key that is sealed cannot run in the backend: `list_opened` lets
the backend filter on everything else and compares the sealed keys on the opened heads,
page by page, with the same paging (offset, limit, cursor) as a backend's listing.
"""

from __future__ import annotations

from statekeeper.codec import StateTamperedError, WrongKeyError
from statekeeper.stores.base import CorruptItem, Page, SessionQuery, SessionRecord, Store
from statekeeper.stores.rules import encode_cursor, matches_query
from statekeeper.stores.sealed.fields import FieldSealer

__all__ = ["list_opened", "open_page"]

_SCAN_PAGE = 500
"""Sessions read per round trip when a listing filters on a sealed metadata key."""


async def list_opened(inner: Store, fields: FieldSealer, tenant: str, query: SessionQuery) -> Page:
    """`Store.list_sessions` of the sealed store over ``inner``."""
    hidden = {k: v for k, v in query.metadata.items() if k not in fields.clear_metadata}
    if not hidden:
        page = await inner.list_sessions(tenant, query)
        items, corrupt = open_page(fields, page)
        return Page.model_construct(items=items, next_cursor=page.next_cursor, corrupt=corrupt)
    shown = {k: v for k, v in query.metadata.items() if k in fields.clear_metadata}
    wanted = SessionQuery.model_construct(metadata=hidden)
    scan = query.model_copy(update={"metadata": shown, "offset": 0, "limit": _SCAN_PAGE})
    found: list[SessionRecord] = []
    damaged: list[CorruptItem] = []
    skip = query.offset
    while len(found) <= query.limit:
        page = await inner.list_sessions(tenant, scan)
        opened, corrupt = open_page(fields, page)
        damaged += corrupt
        for record in opened:
            if not matches_query(record, wanted):
                continue
            if skip:
                skip -= 1
            else:
                found.append(record)
        if page.next_cursor is None:
            break
        scan = scan.model_copy(update={"cursor": page.next_cursor})
    items = found[: query.limit]
    more = len(found) > query.limit
    cursor = encode_cursor(items[-1].last_active, items[-1].id) if more else None
    return Page.model_construct(items=items, next_cursor=cursor, corrupt=damaged)


def open_page(fields: FieldSealer, page: Page) -> tuple[list[SessionRecord], list[CorruptItem]]:
    """A page's heads opened; those that do not open are reported, as damaged ones are."""
    items: list[SessionRecord] = []
    corrupt = list(page.corrupt)
    for record in page.items:
        try:
            items.append(fields.open_session(record))
        except StateTamperedError as exc:
            if isinstance(exc, WrongKeyError):
                raise  # a key missing from the ring is the caller's to fix, not the row's
            corrupt.append(CorruptItem(id=record.id, error=str(exc), raw=str(record.title)[:200]))
    return items, corrupt
