"""``/api/v1/memories``: the long-term store (`statekeeper.longterm`): namespaces, items,
search by filter, put and delete. Reads never refresh an item's TTL: looking is not use.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from statekeeper.errors import InvalidPayloadError, NotFoundError
from statekeeper.jsoncodec import loads
from statekeeper.longterm import LongTermStore, MemoryItem
from statekeeper.server.auth import Admin, Context, Operator, Reader

__all__ = ["router"]

router = APIRouter(prefix="/memories", tags=["memories"])
Namespace = Annotated[list[str], Query(description="the namespace's labels, in order")]
StoreName = Annotated[str, Query(description="the long-term store's name")]


class MemoryWrite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    namespace: list[str] = Field(min_length=1)
    key: str
    value: dict[str, JsonValue]
    ttl: float | None = Field(default=None, gt=0, description="minutes (none: never expires)")


def _memories(context: Any, tenant: str, name: str) -> LongTermStore:
    return LongTermStore(context.store, tenant=tenant, name=name, refresh_on_read=False)


def _item(item: MemoryItem) -> dict[str, Any]:
    return {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": item.value,
        "created_at": item.created_at.isoformat(),
        "updated_at": item.updated_at.isoformat(),
        "expires_at": None if item.expires_at is None else item.expires_at.isoformat(),
    }


@router.get("/namespaces")
async def namespaces(
    caller: Reader,
    context: Context,
    prefix: Namespace = [],  # noqa: B006 (FastAPI copies defaults)
    max_depth: Annotated[int | None, Query(ge=1)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
    store: StoreName = "default",
) -> dict[str, Any]:
    """The namespaces holding live items (``*`` in ``prefix`` matches any one label)."""
    found = await _memories(context, caller.tenant, store).list_namespaces(
        prefix=prefix, max_depth=max_depth, limit=limit, offset=offset
    )
    return {"items": [list(ns) for ns in found]}


@router.get("")
async def search(
    caller: Reader,
    context: Context,
    prefix: Namespace = [],  # noqa: B006
    filter: Annotated[str | None, Query(description="a JSON object: {path: value}")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    offset: Annotated[int, Query(ge=0)] = 0,
    store: StoreName = "default",
) -> dict[str, Any]:
    """Items under the namespace ``prefix`` whose value matches ``filter``."""
    wanted: Any = None
    if filter is not None:
        try:
            wanted = loads(filter)  # a nesting too deep is a ValueError here, not a crash
        except ValueError as exc:
            raise InvalidPayloadError(f"filter is not JSON: {exc}") from None
        if not isinstance(wanted, dict):
            raise InvalidPayloadError('filter must be a JSON object such as {"kind": "note"}')
    found = await _memories(context, caller.tenant, store).search(
        prefix, filter=wanted, limit=limit, offset=offset
    )
    return {"items": [_item(item) for item in found]}


@router.get("/item")
async def get_item(
    namespace: Namespace, key: str, caller: Reader, context: Context, store: StoreName = "default"
) -> dict[str, Any]:
    """One item."""
    item = await _memories(context, caller.tenant, store).get(namespace, key)
    if item is None:
        raise NotFoundError(f"no memory {key!r} in namespace {'/'.join(namespace)!r}")
    return _item(item)


@router.put("/item")
async def put_item(
    body: MemoryWrite, caller: Operator, context: Context, store: StoreName = "default"
) -> dict[str, Any]:
    """Store an item (replacing any at the same namespace and key)."""
    memories = _memories(context, caller.tenant, store)
    written = await memories.put(body.namespace, body.key, body.value, ttl=body.ttl)
    return _item(written)


@router.delete("/item", status_code=204)
async def delete_item(
    namespace: Namespace, key: str, caller: Admin, context: Context, store: StoreName = "default"
) -> Response:
    """Delete an item."""
    if not await _memories(context, caller.tenant, store).delete(namespace, key):
        raise NotFoundError(f"no memory {key!r} in namespace {'/'.join(namespace)!r}")
    return Response(status_code=204)
