"""``/api/v1/stream``: Server-Sent Events per run and per tenant, resumable."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from statekeeper.errors import InvalidInputError, NotFoundError, StatekeeperError
from statekeeper.ids import validate_id
from statekeeper.runs.store import RunStore
from statekeeper.server.auth import Context, Reader
from statekeeper.server.context import ServerContext
from statekeeper.server.streams import TenantCursor, run_events, tenant_events
from statekeeper.server.views import event_json
from statekeeper.tasks import cancel_and_wait

__all__ = ["KEEP_ALIVE", "router"]

router = APIRouter(tags=["stream"])
KEEP_ALIVE = 15.0
"""Seconds between comment lines on a quiet stream (so proxies keep it open)."""
_Message = tuple[str, str, dict[str, Any]]  # id, event name, data


def _frame(message: _Message) -> bytes:
    ident, name, data = message
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return f"id: {ident}\nevent: {name}\ndata: {body}\n\n".encode()


async def _sse(source: AsyncIterator[_Message]) -> AsyncIterator[bytes]:
    """The stream's bytes: the source's messages, with keep-alives while it is quiet."""
    queue: asyncio.Queue[_Message | StatekeeperError | None] = asyncio.Queue(maxsize=256)

    async def pump() -> None:
        try:
            async for message in source:
                await queue.put(message)
        except StatekeeperError as exc:
            await queue.put(exc)
        await queue.put(None)

    task = asyncio.create_task(pump())
    try:
        yield b"retry: 1000\n\n"
        while True:
            try:
                async with asyncio.timeout(KEEP_ALIVE):
                    item = await queue.get()
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if item is None:
                return
            if isinstance(item, StatekeeperError):
                error = {"type": type(item).__name__, "message": str(item)}
                yield f"event: error\ndata: {json.dumps({'error': error})}\n\n".encode()
                return
            yield _frame(item)
    finally:
        await cancel_and_wait(task)


def _position(header: str | None, query: str | None, after: int | None) -> int:
    raw = header if header is not None else query
    if raw is None:
        return after or 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidInputError(f"Last-Event-ID {raw[:40]!r} of a run stream must be a seq >= 0")
    return value


async def _check_position(context: ServerContext, tenant: str, run_id: str, start: int) -> None:
    """Refuse a position past the run's last event: the stream would wait for seqs that
    were never written (and its log reader would skip the ones to come)."""
    if start == 0:
        return
    found = await context.store.read_events(tenant, run_id, after_seq=start - 1, limit=1)
    if not found or found[0].seq != start:
        raise InvalidInputError(
            f"event {start} of run {run_id!r} does not exist; reconnect from a seq the "
            "stream sent, or without Last-Event-ID to start at the run's first event"
        )


async def _session_of(context: ServerContext, tenant: str, run_id: str) -> str | None:
    validate_id(run_id, "run id")
    try:
        return (await RunStore(context.store, tenant).index(run_id))[0].session_id
    except NotFoundError:
        if await context.store.read_events(tenant, run_id, limit=1):
            return None
        raise


async def _run_messages(
    context: ServerContext, tenant: str, run_id: str, session: str | None, after: int
) -> AsyncIterator[_Message]:
    async for event in run_events(context.hub, tenant, run_id, after):
        data = event_json(event, session)
        yield data["id"], data["type"], data


async def _tenant_messages(
    context: ServerContext, tenant: str, cursor: TenantCursor
) -> AsyncIterator[_Message]:
    async for event, session in tenant_events(context.hub, tenant, cursor):
        data = event_json(event, session)
        yield cursor.token(), data["type"], data


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.get(
    "/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def stream(
    caller: Reader,
    context: Context,
    run_id: str | None = None,
    after: Annotated[int | None, Query(ge=0)] = None,
    last_event_id_query: Annotated[str | None, Query(alias="last_event_id")] = None,
    last_event_id: Annotated[str | None, Header()] = None,
    key: Annotated[str | None, Query(description="the API key, for EventSource")] = None,
) -> StreamingResponse:
    """Live events: of one run (``run_id``), or of every run of the tenant."""
    del key  # read by the auth dependency
    # Listening before the stream starts: a write from now on is noticed, none missed.
    await context.hub.ready(caller.tenant)
    if run_id is not None:
        session = await _session_of(context, caller.tenant, run_id)
        start = _position(last_event_id, last_event_id_query, after)
        await _check_position(context, caller.tenant, run_id, start)
        source = _run_messages(context, caller.tenant, run_id, session, start)
    else:
        cursor = TenantCursor.parse(last_event_id or last_event_id_query)
        source = _tenant_messages(context, caller.tenant, cursor)
    return StreamingResponse(_sse(source), media_type="text/event-stream", headers=_SSE_HEADERS)
