"""``/api/v1/sessions``: list, show, entries, the transcript tree, append, fork, export,
import and delete."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from statekeeper.core.messages import Message, MessageCategory, Role
from statekeeper.errors import InvalidPayloadError
from statekeeper.runs.operations import check_no_live_runs
from statekeeper.runs.store import RunStore
from statekeeper.server.auth import Admin, Context, Operator, Reader
from statekeeper.server.branch import branch_seqs
from statekeeper.server.routes_runs import load_run
from statekeeper.server.views import entry_json, run_summary, session_summary, tree_json
from statekeeper.sessions import Session, SessionManager
from statekeeper.stores.base import Entry

__all__ = ["router"]

router = APIRouter(prefix="/sessions", tags=["sessions"])
_TREE_LIMIT = 20_000  # entries drawn in one tree


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NewSession(_Body):
    session_id: str | None = None
    agent_id: str | None = None
    title: str | None = Field(default=None, max_length=1024)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)


_MESSAGE: dict[str, JsonValue] = {
    "type": "object",
    "description": "a Message: its role, content (text, or a list of blocks) and options",
    "required": ["role"],
    "additionalProperties": False,
    "properties": {
        "role": {"type": "string", "enum": [role.value for role in Role]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "category": {"type": "integer", "enum": [int(c) for c in MessageCategory]},
        "id": {"type": "string", "minLength": 1, "maxLength": 128},
        "created_at": {"type": "string", "format": "date-time"},
        "name": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "metadata": {"type": "object"},
        "tokens": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
    },
}
"""What the description says a message is (`Message.from_dict` has the last word)."""


class Append(_Body):
    messages: list[dict[str, JsonValue]] = Field(
        min_length=1, max_length=1000, json_schema_extra={"items": _MESSAGE}
    )


class SessionFork(_Body):
    at: int | str | None = None
    session_id: str | None = None
    title: str | None = Field(default=None, max_length=1024)


def _manager(context: Any, tenant: str) -> SessionManager:
    # max_messages=None: an operator's append must not move a session on by itself.
    return SessionManager(context.store, tenant, max_messages=None, auto_continue=False)


async def _branch_ids(session: Session, page: list[Entry]) -> set[str]:
    """The ids of the entries of ``page`` on the session's active branch (as the handle
    last read its head: the head is read once per request)."""
    manager, head = session.manager, session.record.head_seq
    seqs = await branch_seqs(manager.store, manager.tenant, session.id, head, page)
    return {e.id for e in page if e.seq in seqs}


@router.get("")
async def list_sessions(
    caller: Reader,
    context: Context,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
    agent_id: str | None = None,
    active_after: datetime | None = None,
    active_before: datetime | None = None,
) -> dict[str, Any]:
    """Sessions, most recently active first (of one agent, active in a window)."""
    page = await _manager(context, caller.tenant).list(
        limit=limit,
        cursor=cursor,
        agent_id=agent_id,
        all_agents=agent_id is None,
        active_after=active_after,
        active_before=active_before,
    )
    return {
        "items": [session_summary(r) for r in page.items],
        "next_cursor": page.next_cursor,
        "corrupt": context.reported(page.corrupt),
    }


@router.post("", status_code=201)
async def create_session(body: NewSession, caller: Operator, context: Context) -> Any:
    """Create an empty session."""
    session = await _manager(context, caller.tenant).create(
        session_id=body.session_id,
        agent_id=body.agent_id,
        title=body.title,
        metadata=body.metadata,
    )
    return session_summary(session.record)


@router.get("/{session_id}")
async def show_session(session_id: str, caller: Reader, context: Context) -> dict[str, Any]:
    """One session, with its state and the runs over it."""
    record = (await _manager(context, caller.tenant).get(session_id)).record
    runs = RunStore(context.store, caller.tenant)
    found = []
    for index in await runs.list(session_id=session_id, limit=1000):
        found.append(run_summary(*await load_run(runs, index.run_id)))
    return session_summary(record) | {
        "state": record.state,
        "model_override": record.model_override,
        "thinking_level": record.thinking_level,
        "runs": found,
    }


@router.get("/{session_id}/entries")
async def entries(
    session_id: str,
    caller: Reader,
    context: Context,
    after_seq: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    """A page of the transcript's stored entries (every branch), in seq order."""
    session = await _manager(context, caller.tenant).get(session_id)
    page = await session.entries(after_seq=after_seq, limit=limit)
    branch = await _branch_ids(session, page)
    by_seq = {e.seq: e for e in page}
    if any(e.kind == "compaction" for e in page):
        # What a compaction stands for is among its ancestors: read the entries before it
        # (the nearest ones, when there are more than a tree draws).
        last = page[-1].seq
        earlier = await session.entries(after_seq=max(0, last - _TREE_LIMIT), until_seq=last)
        by_seq = {e.seq: e for e in earlier}
    return {
        "items": [entry_json(e, by_seq, branch) for e in page],
        "next_after_seq": page[-1].seq if len(page) == limit else None,
    }


@router.get("/{session_id}/tree")
async def tree(session_id: str, caller: Reader, context: Context) -> dict[str, Any]:
    """The transcript as a DAG: entries, parent and summary edges, continuation links."""
    session = await _manager(context, caller.tenant).get(session_id)
    stored: list[Entry] = await session.entries(limit=_TREE_LIMIT)
    branch = await _branch_ids(session, stored)
    return tree_json(session.record, stored, branch)


@router.post("/{session_id}/messages", status_code=201)
async def append(session_id: str, body: Append, caller: Operator, context: Context) -> Any:
    """Append messages (all or none)."""
    messages = []
    for data in body.messages:
        if not isinstance(data, dict):
            raise InvalidPayloadError("each message must be a JSON object")
        messages.append(Message.from_dict(data))
    session = await _manager(context, caller.tenant).get(session_id)
    outcome = await session.append(*messages, strict=False)
    by_seq = {e.seq: e for e in outcome.entries}
    branch = {e.id for e in outcome.entries}
    return {
        "session": session_summary(session.record),
        "entries": [entry_json(e, by_seq, branch) for e in outcome.entries],
    }


@router.post("/{session_id}/fork", status_code=201)
async def fork(session_id: str, body: SessionFork, caller: Operator, context: Context) -> Any:
    """A new session whose history is this one's up to entry ``at`` (default: the head)."""
    source = await _manager(context, caller.tenant).get(session_id)
    made = await source.fork(body.at, session_id=body.session_id, title=body.title)
    return session_summary(made.record)


@router.get("/{session_id}/export")
async def export(session_id: str, caller: Reader, context: Context) -> dict[str, Any]:
    """The session as one self-contained JSON document (for import)."""
    return await _manager(context, caller.tenant).export(session_id)


@router.post("/import", status_code=201)
async def import_(
    document: dict[str, JsonValue],
    caller: Operator,
    context: Context,
    session_id: str | None = None,
) -> Any:
    """Import a document made by export (under ``session_id`` if given)."""
    made = await _manager(context, caller.tenant).import_(document, session_id=session_id)
    return session_summary(made.record)


@router.delete("/{session_id}", status_code=204)
async def delete(session_id: str, caller: Admin, context: Context, force: bool = False) -> Response:
    """Delete the session and its transcript; 409 while a run that has not finished uses
    it, unless ``force``."""
    if not force:
        await check_no_live_runs(context.store, caller.tenant, session_id)
    await _manager(context, caller.tenant).delete(session_id)
    return Response(status_code=204)
