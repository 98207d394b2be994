"""``/api/v1``: subagents, lanes, auth profiles (never secrets), records, whoami."""

from __future__ import annotations

import sys
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidInputError, NotFoundError
from statekeeper.runs.operations import (
    OPERATOR_ID,
    Killed,
    kill_subagent,
    lanes_json,
    lanes_of,
    steer_subagent,
)
from statekeeper.runs.store import RUNS_NAMESPACE, RunStore
from statekeeper.runtime.profiles import NAMESPACE as PROFILES_NAMESPACE
from statekeeper.runtime.profiles import AuthProfile, AuthProfiles, mask_secret
from statekeeper.runtime.subagents import NAMESPACE as SUBAGENTS_NAMESPACE
from statekeeper.runtime.subagents import SubagentRegistry, SubagentStatus
from statekeeper.server.auth import Admin, Context, Operator, Reader
from statekeeper.stores.base import VersionedRecord

__all__ = ["router"]

router = APIRouter(tags=["runtime"])


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Steer(_Body):
    text: str = Field(min_length=1, max_length=1_000_000)


class ProfileReset(_Body):
    agent: str
    profile_id: str | None = None


class RecordWrite(_Body):
    value: JsonValue
    expected_version: int | None = Field(default=None, ge=0)


@router.get("/whoami")
async def whoami(caller: Reader) -> dict[str, Any]:
    """The tenant and scope of the key this request used."""
    return {"tenant": caller.tenant, "scope": caller.scope, "key_id": caller.key_id}


@router.get("/subagents")
async def subagents(
    caller: Reader,
    context: Context,
    requester: str | None = None,
    status: SubagentStatus | None = None,
) -> dict[str, Any]:
    """Delegated (child) runs, oldest start first."""
    registry = SubagentRegistry(context.store, caller.tenant, owner_id=OPERATOR_ID)
    entries = await registry.list(requester=requester, status=status)
    return {"items": [entry.model_dump(mode="json") for entry in entries]}


@router.post("/subagents/{run_id}/kill")
async def kill(run_id: str, caller: Operator, context: Context) -> dict[str, Any]:
    """Cancel a child run and mark its entry killed."""
    entry = await kill_subagent(
        context.store, caller.tenant, run_id, Killed(), by=f"the server ({caller.decided_by})"
    )
    context.hub.poke(caller.tenant, run_id)
    return entry.model_dump(mode="json")


@router.post("/subagents/{run_id}/steer")
async def steer(run_id: str, body: Steer, caller: Operator, context: Context) -> dict[str, Any]:
    """Send a user message to a running child run (read at its next step)."""
    await steer_subagent(context.store, caller.tenant, run_id, body.text)
    registry = SubagentRegistry(context.store, caller.tenant, owner_id=OPERATOR_ID)
    return (await registry.get(run_id)).model_dump(mode="json")


@router.get("/lanes")
async def lanes(caller: Reader, context: Context) -> dict[str, Any]:
    """Runs that hold a session lane now, and leases left to expire."""
    runs = await RunStore(context.store, caller.tenant).list(limit=sys.maxsize)
    return lanes_json(lanes_of(runs, utcnow()))


def _profile(profile: AuthProfile) -> dict[str, Any]:
    data = profile.model_dump(mode="json", exclude={"secret_ref"})
    masked = mask_secret(profile.secret_ref)
    return data | {"secret_ref": masked, "cooling": profile.cooling(utcnow())}


@router.get("/profiles")
async def profiles(agent: str, caller: Reader, context: Context) -> dict[str, Any]:
    """An agent's auth profiles; the secret reference is masked, never shown."""
    found = await AuthProfiles(context.store, caller.tenant, agent).list()
    return {"items": [_profile(p) for p in found]}


@router.post("/profiles/reset")
async def reset_profiles(body: ProfileReset, caller: Operator, context: Context) -> Any:
    """Clear cooldowns and failure streaks (one profile, or every one of the agent)."""
    profiles = AuthProfiles(context.store, caller.tenant, body.agent)
    if body.profile_id is not None:
        await profiles.get(body.profile_id)
    elif not await profiles.list():
        raise NotFoundError(f"agent {body.agent!r} has no auth profiles")
    await profiles.reset(body.profile_id)
    return {"items": [_profile(p) for p in await profiles.list()]}


_LIBRARY = frozenset({RUNS_NAMESPACE, SUBAGENTS_NAMESPACE, PROFILES_NAMESPACE})


def _own(namespace: str) -> str:
    """``namespace``, unless the library keeps its own records there (runs, subagents
    profiles and the long-term store have their own routes: raw writes would bypass
    their rules, raw reads would show a profile's secret reference)."""
    if namespace in _LIBRARY or namespace.startswith("ltm."):
        raise InvalidInputError(
            f"namespace {namespace!r} holds the library's own records; use the "
            "runs, subagents, profiles or memories routes"
        )
    return namespace


def _record(record: VersionedRecord) -> dict[str, Any]:
    return record.model_dump(mode="json")


@router.get("/records/{namespace}")
async def records(
    namespace: str,
    caller: Reader,
    context: Context,
    prefix: str = "",
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Live records of a namespace of the long-term store, in key order."""
    page = await context.store.list_records(
        caller.tenant, _own(namespace), prefix=prefix, after_key=cursor, limit=limit
    )
    return {
        "items": [_record(r) for r in page],
        "next_cursor": page[-1].key if len(page) == limit else None,
        "corrupt": context.reported(page.corrupt),
    }


@router.get("/records/{namespace}/{key}")
async def get_record(namespace: str, key: str, caller: Reader, context: Context) -> Any:
    """One record."""
    return _record(await context.store.get_record(caller.tenant, _own(namespace), key))


@router.put("/records/{namespace}/{key}")
async def put_record(
    namespace: str, key: str, body: RecordWrite, caller: Operator, context: Context
) -> Any:
    """Write a record (``expected_version``: compare-and-set; 0: must not exist)."""
    written = await context.store.put_record(
        caller.tenant, _own(namespace), key, body.value, expected_version=body.expected_version
    )
    return _record(written)


@router.delete("/records/{namespace}/{key}", status_code=204)
async def delete_record(namespace: str, key: str, caller: Admin, context: Context) -> Response:
    """Delete a record."""
    await context.store.delete_record(caller.tenant, _own(namespace), key)
    return Response(status_code=204)
